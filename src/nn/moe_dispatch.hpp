#pragma once
// The token exchange of MoeMlp (nn/moe.hpp) with the experts' ranks, internal
// to src/nn: the per-expert counts (one small blocking all-to-all), the
// expert-side row layout, and the rows themselves, blocking or started
// (comm/alltoall.hpp: alltoallv_start) so that the layer computes while they
// travel. Each exchange is timed into MoeShared: `wait` the seconds this rank
// spent inside the exchange's calls (start, progress, wait: blocked, the
// exposed part), `span` from its start until the rows received are here
// (wait_received, or wait: what the exchange took, hidden or not).
#include <chrono>
#include <cstdint>
#include <vector>

#include "ringtrain/comm/alltoall.hpp"
#include "ringtrain/nn/moe.hpp"

namespace ringtrain::detail {

// recv_counts[i * L + l]: rows rank i sends for local expert l (what kept[],
// rank i's per-expert counts, holds at its [rank * L + l]). Blocking; timed.
std::vector<std::size_t> exchange_expert_counts(const ExpertGroup& g, const std::vector<std::size_t>& kept, int L);

// The expert side's rows from s.recv_counts: local expert l's rows sit in
// block l of `stride` rows (the busiest expert's count rounded up to 8), this
// rank's own tokens first (s.own[l] of them: they need no exchange), then the
// other ranks' in rank order after this one; slot[i] = the block row of
// received row perm[i].
void expert_layout(MoeMlp::Saved& s, int ranks, int L, int rank);

// Which received rows are this rank's own (recv's block from itself: no
// exchange), and the per-expert row counts of the two passes.
struct RowSplit {
  std::int64_t lo = 0, hi = 0;            // own rows of recv: [lo, hi)
  std::vector<std::int64_t> zero, remote;  // per local expert: 0, and rows - own
  bool is_own(std::int64_t recv_row) const { return recv_row >= lo && recv_row < hi; }
};
RowSplit row_split(const MoeMlp::Saved& s, int ranks, int L, int rank);

// Whether token t's kept assignments all went to this rank's experts (its
// combine needs nothing of the exchange).
bool token_is_local(const MoeMlp::Saved& s, std::int64_t t, int k, int L, int rank);

// Rows of D floats between the token side (grouped by destination rank, then
// local expert) and the expert side (grouped by source rank, then local
// expert). forward_dir: token side -> expert side (send_counts out,
// recv_counts in); else back.
class RowExchange {
 public:
  RowExchange(const ExpertGroup& g, int L, std::int64_t D) : g_(g), L_(L), D_(D) {}
  // Destroyed while in flight: AlltoallvRequest's destructor completes it.
  // `out` is resized to the rows received; `in` and `out` must stay untouched
  // until wait(). overlap: returns once posted (this rank's own block already
  // copied); else completes before returning.
  void start(const MoeMlp::Saved& s, const std::vector<float>& in, std::vector<float>& out, bool forward_dir,
             bool overlap);
  void progress();  // between GEMMs: lets MPI move the rows on
  void wait_received();  // the rows received are here (this rank's sends may still be in flight)
  void wait();           // completes (a no-op when nothing is in flight); start() calls it first

 private:
  const ExpertGroup& g_;
  int L_;
  std::int64_t D_;
  AlltoallvRequest req_;
  std::chrono::steady_clock::time_point t0_;
  bool open_ = false, received_ = false;
};

}  // namespace ringtrain::detail
