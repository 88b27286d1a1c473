// The trainer's side of checkpoints (the logic of writing, finding and
// checking them is checkpoint_session.cpp): what the state is on every layout
// and how it is restored. The grid model hands over its state per parameter,
// tensor shards whole and ZeRO-1 slices gathered, so one file serves every layout.
#include <algorithm>
#include <cstring>
#include <functional>

#include "ringtrain/train/checkpoint.hpp"
#include "trainer_impl.hpp"

namespace ringtrain {

NamedTensorList Trainer::Impl::extra_state() {
  NamedTensorList s;
  if (LossScaler* sc = gm->scaler()) {
    sc->save(scaler_state.data<double>());
    s.emplace_back("amp.loss_scale", scaler_state);
  }
  return s;
}

namespace {

// Host-to-host copies cut into 4 MiB chunks over the compute threads (idle at
// the step boundary): one thread's memcpy does not reach the memory bandwidth.
void copy_chunked(const std::vector<std::pair<Tensor, Tensor>>& copies) {
  struct Chunk {
    char* dst;
    const char* src;
    std::size_t n;
  };
  constexpr std::size_t kChunk = std::size_t{4} << 20;
  std::vector<Chunk> chunks;
  for (const auto& [dst, src] : copies)
    for (std::size_t at = 0; at < dst.nbytes(); at += kChunk)
      chunks.push_back({static_cast<char*>(dst.raw()) + at, static_cast<const char*>(src.raw()) + at,
                        std::min(kChunk, dst.nbytes() - at)});
  const std::int64_t n = static_cast<std::int64_t>(chunks.size());
#pragma omp parallel for schedule(dynamic) if (n > 1)
  for (std::int64_t i = 0; i < n; ++i) std::memcpy(chunks[i].dst, chunks[i].src, chunks[i].n);
}

}  // namespace

// checkpoint.async: the tensors to write become a private host snapshot. A
// tensor received from another rank, gathered from shards or copied off the
// GPU is one already; a view of this rank's live memory (`live`) is copied,
// so its bytes are copied exactly once. The copy is the whole stall.
void Trainer::Impl::snapshot(NamedTensorList& state, const std::function<bool(const Tensor&)>& live) {
  std::vector<std::pair<Tensor, Tensor>> host;  // (snapshot buffer, live tensor)
  for (std::size_t i = 0; i < state.size(); ++i) {
    auto& [name, t] = state[i];
    if (t.device().is_cpu() && !live(t)) continue;
    // The last snapshot's buffer (its write is over: CheckpointSession::save waited before
    // asking): fresh pages would cost more than the copy itself. The buffers are owned here
    // and by the write job, so a trainer ending mid-write never frees them under it.
    Tensor buf;
    if (i < snapshot_pool.size() && snapshot_pool[i].first == name && snapshot_pool[i].second.dtype() == t.dtype() &&
        snapshot_pool[i].second.shape() == t.shape())
      buf = snapshot_pool[i].second;
    else
      buf = Tensor::empty(t.shape(), t.dtype());
    if (t.device().is_cpu()) host.emplace_back(buf, t);
    else buf.copy_from(t);  // off the device
    t = buf;
  }
  copy_chunked(host);
  snapshot_pool.clear();
  for (auto& [name, t] : state) snapshot_pool.emplace_back(name, t);
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
    // World rank 0 gathers every stage's whole state (collective on every rank).
    saved = true;
    NamedTensorList all = gm->gather_whole_state(0);
    if (world.rank() == 0) {
      for (auto& e : extra_state()) all.emplace_back(e.first, e.second.clone());  // small, and live
      if (cfg.checkpoint.async) {
        std::vector<std::pair<const char*, const char*>> ranges;
        for (auto& [name, t] : gm->replicated_state())
          if (t.device().is_cpu() && t.nbytes())
            ranges.emplace_back(static_cast<const char*>(t.raw()), static_cast<const char*>(t.raw()) + t.nbytes());
        snapshot(all, [&](const Tensor& t) {
          const char* p = static_cast<const char*>(t.raw());
          return std::any_of(ranges.begin(), ranges.end(), [&](const auto& r) { return p >= r.first && p < r.second; });
        });
      }
    }
    return all;
  };
  state.pieces = [&] {
    // This rank's share, no communication; everything in it views live memory.
    saved = true;
    std::vector<StatePiece> pieces = gm->state_pieces();
    if (world.rank() == 0)
      for (auto& [name, t] : extra_state()) pieces.push_back({name, t.flat_view(0, t.numel()), {t.shape(), {}, 0}});
    if (cfg.checkpoint.async) {
      NamedTensorList ts;
      for (auto& p : pieces) ts.emplace_back(p.name, p.data);
      snapshot(ts, [](const Tensor&) { return true; });
      for (std::size_t i = 0; i < pieces.size(); ++i) pieces[i].data = ts[i].second;
    }
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
  r.wanted = [&](bool with_opt) { return gm->whole_names(with_opt); };
  r.apply = [&](const CheckpointData& ck, bool with_opt) {
    gm->restore_whole_state([&](const std::string& name, Tensor& whole) {
      restore_tensor(ck, name, whole);
      return true;
    }, with_opt);
    if (!with_opt) return;
    // The loss scale continues where it was (a checkpoint of an fp32 run has none: start afresh).
    for (auto& [name, t] : ck.tensors)
      if (name == "amp.loss_scale" && gm->scaler()) {
        restore_tensor(ck, name, scaler_state);
        gm->scaler()->load(scaler_state.data<double>());
      }
  };
  return ckpt.load(path, with_optimizer, r, steps_per_epoch());
}

}  // namespace ringtrain
