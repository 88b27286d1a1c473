// The trainer's side of checkpoints (the logic of writing, finding and
// checking them is checkpoint_session.cpp): what the state is on every layout
// and how it is restored. The grid model hands over its state per parameter,
// tensor shards whole and ZeRO-1 slices gathered, so one file serves every layout.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "ringtrain/core/stream_copy.hpp"
#include "ringtrain/train/checkpoint.hpp"
#include "trainer_impl.hpp"

namespace ringtrain {

NamedTensorList Trainer::Impl::extra_state() {
  NamedTensorList s;
  if (LossScaler* sc = parts.updater->scaler()) {
    sc->save(scaler_state.data<double>());
    s.emplace_back("amp.loss_scale", scaler_state);
  }
  return s;
}

namespace {

// Contiguous stretches of live host memory, to copy with one memcpy each.
struct Run {
  const char* src;
  std::size_t bytes;
};

// Runs covering `ts` (sorted by address; gaps up to 64 bytes, the arena's
// alignment padding, are copied along), and each tensor's run and offset in it.
std::vector<Run> runs_of(const std::vector<const Tensor*>& ts, std::vector<std::pair<std::size_t, std::size_t>>& at) {
  std::vector<std::size_t> order(ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) order[i] = i;
  auto src = [&](std::size_t i) { return static_cast<const char*>(ts[i]->raw()); };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return src(a) < src(b); });
  std::vector<Run> runs;
  at.assign(ts.size(), {0, 0});
  for (std::size_t i : order) {
    const char* p = src(i);
    const std::size_t n = ts[i]->nbytes();
    if (runs.empty() || p > runs.back().src + runs.back().bytes + 64) runs.push_back({p, 0});
    Run& r = runs.back();
    at[i] = {runs.size() - 1, static_cast<std::size_t>(p - r.src)};
    r.bytes = std::max(r.bytes, static_cast<std::size_t>(p - r.src) + n);
  }
  return runs;
}

// Each run in at most one piece per compute thread (idle at the step
// boundary), with non-temporal stores: the snapshot is not read again until
// the background write.
void copy_runs(const std::vector<Run>& runs, const std::vector<Tensor>& blocks) {
  struct Piece {
    char* dst;
    const char* src;
    std::size_t n;
  };
  const std::size_t threads = static_cast<std::size_t>(std::max(1, omp_get_max_threads()));
  constexpr std::size_t kMinPiece = std::size_t{16} << 20;
  std::vector<Piece> pieces;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const std::size_t parts = std::clamp<std::size_t>(runs[r].bytes / kMinPiece, 1, threads);
    const std::size_t per = (runs[r].bytes / parts + 16383) / 16384 * 16384;  // whole 4-page blocks
    for (std::size_t at = 0; at < runs[r].bytes; at += per)
      pieces.push_back({static_cast<char*>(blocks[r].raw()) + at, runs[r].src + at, std::min(per, runs[r].bytes - at)});
  }
  const std::int64_t n = static_cast<std::int64_t>(pieces.size());
#pragma omp parallel for schedule(dynamic) if (n > 1)
  for (std::int64_t i = 0; i < n; ++i) stream_copy(pieces[i].dst, pieces[i].src, pieces[i].n);
}

}  // namespace

// checkpoint.async: the tensors to write become a private host snapshot. A
// tensor received from another rank, gathered from shards or copied off the
// GPU is one already; a view of this rank's live memory (`live`) is copied,
// so its bytes are copied exactly once. The copy is the whole stall: it goes
// run by run (the arena's flat buffers) into blocks reused from checkpoint to
// checkpoint (fresh pages cost more than the copy), and the snapshot's tensors
// are views that keep their block alive, so a trainer ending mid-write never
// frees memory under the write.
void Trainer::Impl::snapshot(NamedTensorList& state, const std::function<bool(const Tensor&)>& live, bool copy) {
  std::vector<const Tensor*> host;
  std::vector<std::size_t> which;
  for (std::size_t i = 0; i < state.size(); ++i) {
    Tensor& t = state[i].second;
    if (!t.device().is_cpu()) {
      if (copy) t = t.to(Device::cpu());  // off the device: a private copy already
    } else if (t.nbytes() && live(t)) {
      host.push_back(&t);
      which.push_back(i);
    }
  }
  std::vector<std::pair<std::size_t, std::size_t>> at;
  std::vector<Run> runs = runs_of(host, at);
  // Runs under 4 KiB are copied tensor by tensor (a fresh small tensor, as ZeRO-1's step
  // count, would otherwise move the blocks' order from one checkpoint to the next).
  std::vector<int> block_of(runs.size(), -1);
  std::vector<Run> big;
  for (std::size_t r = 0; r < runs.size(); ++r)
    if (runs[r].bytes >= 4096) {
      block_of[r] = static_cast<int>(big.size());
      big.push_back(runs[r]);
    }
  // The last snapshot's blocks when the runs are the same sizes (its write is
  // over: CheckpointSession::save waited before asking for this one).
  bool reuse = snapshot_blocks.size() == big.size();
  for (std::size_t r = 0; reuse && r < big.size(); ++r) reuse = snapshot_blocks[r].nbytes() == big[r].bytes;
  if (!reuse) {
    snapshot_blocks.clear();
    for (const Run& r : big) {
      snapshot_blocks.push_back(Tensor::empty({static_cast<std::int64_t>(r.bytes)}, DType::u8));
      if (!copy) std::memset(snapshot_blocks.back().raw(), 0, r.bytes);  // pages faulted in now, not in a stall
    }
  }
  if (!copy) return;
  copy_runs(big, snapshot_blocks);
  for (std::size_t k = 0; k < which.size(); ++k) {
    Tensor& t = state[which[k]].second;
    const int b = block_of[at[k].first];
    t = b < 0 ? t.clone() : snapshot_blocks[static_cast<std::size_t>(b)].view_bytes(at[k].second, t.shape(), t.dtype());
  }
}

// Rank 0 gets the whole state (collective). One rank on the host without ZeRO-1
// (whose gather makes a new whole optimizer each time): its views, listed once.
bool Trainer::Impl::local_views() const {
  return world.size() == 1 && device.is_cpu() && !parts.updater->zero();
}

NamedTensorList Trainer::Impl::whole_for_checkpoint() {
  const bool local = local_views();
  if (local && whole_views.empty()) whole_views = parts.state->gather_whole(0);
  NamedTensorList all = local ? whole_views : parts.state->gather_whole(0);
  if (world.rank() == 0)
    for (auto& e : extra_state()) all.emplace_back(e.first, e.second.clone());  // small, and live
  return all;
}

// This rank's share, no communication; everything in it views live memory.
std::vector<StatePiece> Trainer::Impl::pieces_for_checkpoint() {
  std::vector<StatePiece> pieces = parts.state->pieces();
  if (world.rank() == 0)
    for (auto& [name, t] : extra_state()) pieces.push_back({name, t.flat_view(0, t.numel()), {t.shape(), {}, 0}});
  return pieces;
}

// Whether a host tensor views this rank's live state (the memory does not move: listed once).
bool Trainer::Impl::is_live(const Tensor& t) {
  if (live_ranges.empty())
    for (auto& [name, s] : parts.state->replicated())
      if (s.device().is_cpu() && s.nbytes())
        live_ranges.emplace_back(static_cast<const char*>(s.raw()), static_cast<const char*>(s.raw()) + s.nbytes());
  const char* p = static_cast<const char*>(t.raw());
  return std::any_of(live_ranges.begin(), live_ranges.end(), [&](const auto& r) { return p >= r.first && p < r.second; });
}

void Trainer::Impl::snapshot_pieces(std::vector<StatePiece>& pieces, bool copy) {
  NamedTensorList ts;
  for (auto& p : pieces) ts.emplace_back(p.name, p.data);
  snapshot(ts, [](const Tensor&) { return true; }, copy);
  for (std::size_t i = 0; i < pieces.size(); ++i) pieces[i].data = ts[i].second;
}

// checkpoint.async: the snapshot's blocks allocated and touched at the run's
// start where this rank's snapshot is local (parallel parts, or one rank),
// so the first checkpoint stalls no longer than the others.
void Trainer::Impl::prepare_snapshot() {
  if (cfg.checkpoint.dir.empty() || !cfg.checkpoint.async) return;
  if (ckpt.parallel()) {
    std::vector<StatePiece> pieces = pieces_for_checkpoint();
    snapshot_pieces(pieces, false);
  } else if (local_views()) {
    NamedTensorList all = whole_for_checkpoint();
    snapshot(all, [&](const Tensor& t) { return is_live(t); }, false);
  }
}

// Every `checkpoint.every_epochs` epochs, or always with `force` (the run ends:
// last epoch, train.max_steps, signal).
void Trainer::Impl::save_checkpoint(bool force) {
  // The position was just saved (checkpoint.every_steps on train.max_steps' step): the same file again.
  if (saved_at_step == pos.step) return;
  const auto t0 = Clock::now();
  bool saved = false;
  CheckpointSession::StateSource state;
  state.whole = [&] {
    saved = true;
    NamedTensorList all = whole_for_checkpoint();
    if (world.rank() == 0 && cfg.checkpoint.async) snapshot(all, [&](const Tensor& t) { return is_live(t); });
    return all;
  };
  state.pieces = [&] {
    saved = true;
    std::vector<StatePiece> pieces = pieces_for_checkpoint();
    if (cfg.checkpoint.async) snapshot_pieces(pieces);
    return pieces;
  };
  std::string path = ckpt.save(force, state);
  if (!path.empty()) last_checkpoint = path;
  if (saved) {
    saved_at_step = pos.step;
    checkpoint_stalls_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
}

// Every rank receives the checkpoint; each checks and takes the names it owns
// (its stage, its part of a tensor shard, its ZeRO-1 slice), so any layout
// loads any checkpoint.
bool Trainer::Impl::load(const std::string& path, bool with_optimizer) {
  CheckpointSession::Restore r;
  r.wanted = [&](bool with_opt) { return parts.state->whole_names(with_opt); };
  r.apply = [&](const CheckpointData& ck, bool with_opt) {
    parts.state->restore_whole([&](const std::string& name, Tensor& whole) {
      restore_tensor(ck, name, whole);
      return true;
    }, with_opt);
    if (!with_opt) return;
    // The loss scale continues where it was (a checkpoint of an fp32 run has none: start afresh).
    for (auto& [name, t] : ck.tensors)
      if (name == "amp.loss_scale" && parts.updater->scaler()) {
        restore_tensor(ck, name, scaler_state);
        parts.updater->scaler()->load(scaler_state.data<double>());
      }
  };
  return ckpt.load(path, with_optimizer, r, steps_per_epoch());
}

}  // namespace ringtrain
