#include "snapshot.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "ringtrain/core/stream_copy.hpp"

namespace ringtrain {
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

NamedTensorList as_list(const std::vector<StatePiece>& pieces) {
  NamedTensorList ts;
  for (const auto& p : pieces) ts.emplace_back(p.name, p.data);
  return ts;
}

}  // namespace

void Snapshot::take(std::vector<StatePiece>& pieces) {
  NamedTensorList ts = as_list(pieces);
  copy(ts, false, true);
  for (std::size_t i = 0; i < pieces.size(); ++i) pieces[i].data = ts[i].second;
}

void Snapshot::prepare(std::vector<StatePiece> pieces) {
  NamedTensorList ts = as_list(pieces);
  copy(ts, false, false);
}

bool Snapshot::is_live(const Tensor& t) {
  if (live_ranges_.empty())
    for (auto& [name, s] : live_state_())
      if (s.device().is_cpu() && s.nbytes())
        live_ranges_.emplace_back(static_cast<const char*>(s.raw()), static_cast<const char*>(s.raw()) + s.nbytes());
  const char* p = static_cast<const char*>(t.raw());
  return std::any_of(live_ranges_.begin(), live_ranges_.end(),
                     [&](const auto& r) { return p >= r.first && p < r.second; });
}

// `check_live`: only the host tensors that view live memory are copied (else
// all). `copy` false: only the blocks, allocated and touched.
void Snapshot::copy(NamedTensorList& state, bool check_live, bool copy) {
  std::vector<const Tensor*> host;
  std::vector<std::size_t> which;
  for (std::size_t i = 0; i < state.size(); ++i) {
    Tensor& t = state[i].second;
    if (!t.device().is_cpu()) {
      if (copy) t = t.to(Device::cpu());  // off the device: a private copy already
    } else if (t.nbytes() && (!check_live || is_live(t))) {
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
  // The last snapshot's blocks when the runs are the same sizes (its write is over).
  bool reuse = blocks_.size() == big.size();
  for (std::size_t r = 0; reuse && r < big.size(); ++r) reuse = blocks_[r].nbytes() == big[r].bytes;
  if (!reuse) {
    blocks_.clear();
    for (const Run& r : big) {
      blocks_.push_back(Tensor::empty({static_cast<std::int64_t>(r.bytes)}, DType::u8));
      if (!copy) std::memset(blocks_.back().raw(), 0, r.bytes);  // pages faulted in now, not in a stall
    }
  }
  if (!copy) return;
  copy_runs(big, blocks_);
  for (std::size_t k = 0; k < which.size(); ++k) {
    Tensor& t = state[which[k]].second;
    const int b = block_of[at[k].first];
    t = b < 0 ? t.clone() : blocks_[static_cast<std::size_t>(b)].view_bytes(at[k].second, t.shape(), t.dtype());
  }
}

}  // namespace ringtrain
