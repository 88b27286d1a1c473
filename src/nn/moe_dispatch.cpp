// The token exchange of MoeMlp (moe_dispatch.hpp): counts, expert-side
// layout, and the rows, blocking or started.
#include "moe_dispatch.hpp"

#include <algorithm>
#include <numeric>

namespace ringtrain::detail {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Elements per rank: the rows of its local experts times D.
std::vector<std::size_t> rank_totals(const std::vector<std::size_t>& per_expert, int ranks, int local, std::int64_t d) {
  std::vector<std::size_t> out(static_cast<std::size_t>(ranks), 0);
  for (int j = 0; j < ranks; ++j)
    for (int l = 0; l < local; ++l) out[j] += per_expert[static_cast<std::size_t>(j * local + l)] * std::size_t(d);
  return out;
}

}  // namespace

std::vector<std::size_t> exchange_expert_counts(const ExpertGroup& g, const std::vector<std::size_t>& kept, int L) {
  if (g.size == 1) return kept;
  std::vector<std::int64_t> sc(kept.begin(), kept.end()), rc(kept.size());
  const auto t0 = Clock::now();
  alltoall(sc.data(), rc.data(), static_cast<std::size_t>(L), DType::i64, g.comm);
  const double t = since(t0);
  g.shared->alltoall_wait_s += t;  // blocking: all of it exposed
  g.shared->alltoall_span_s += t;
  g.shared->alltoall_counts_s += t;
  return std::vector<std::size_t>(rc.begin(), rc.end());
}

void expert_layout(MoeMlp::Saved& s, int ranks, int L, int rank) {
  const auto& rc = s.recv_counts;
  std::vector<std::size_t> src_off(static_cast<std::size_t>(ranks), 0);  // rank i's first row in recv
  for (int i = 1; i < ranks; ++i) {
    src_off[i] = src_off[i - 1];
    for (int l = 0; l < L; ++l) src_off[i] += rc[(i - 1) * L + l];
  }
  s.rows.assign(static_cast<std::size_t>(L), 0);
  s.own.assign(static_cast<std::size_t>(L), 0);
  s.perm.clear();
  for (int l = 0; l < L; ++l)
    for (int q = 0; q < ranks; ++q) {
      const int i = (rank + q) % ranks;  // this rank first: its rows are here before any exchange
      std::size_t o = src_off[i];
      for (int m = 0; m < l; ++m) o += rc[i * L + m];
      for (std::size_t r = 0; r < rc[i * L + l]; ++r) s.perm.push_back(static_cast<std::int64_t>(o + r));
      s.rows[l] += static_cast<std::int64_t>(rc[i * L + l]);
      if (q == 0) s.own[l] = static_cast<std::int64_t>(rc[i * L + l]);
    }
  const std::int64_t M = (*std::max_element(s.rows.begin(), s.rows.end()) + 7) / 8 * 8;
  s.stride = M;
  s.slot.resize(s.perm.size());
  for (std::int64_t l = 0, i = 0; l < L; ++l)
    for (std::int64_t j = 0; j < s.rows[l]; ++j) s.slot[i++] = l * M + j;
}

RowSplit row_split(const MoeMlp::Saved& s, int ranks, int L, int rank) {
  RowSplit r;
  for (int i = 0; i < ranks; ++i)
    for (int l = 0; l < L; ++l) {
      const auto c = static_cast<std::int64_t>(s.recv_counts[i * L + l]);
      if (i < rank) r.lo += c;
      if (i <= rank) r.hi += c;
    }
  r.zero.assign(static_cast<std::size_t>(L), 0);
  r.remote.resize(static_cast<std::size_t>(L));
  for (int l = 0; l < L; ++l) r.remote[l] = s.rows[l] - s.own[l];
  return r;
}

bool token_is_local(const MoeMlp::Saved& s, std::int64_t t, int k, int L, int rank) {
  for (std::int64_t a = t * k; a < (t + 1) * k; ++a)
    if (s.row[a] >= 0 && s.expert[a] / L != rank) return false;
  return true;
}

void RowExchange::start(const MoeMlp::Saved& s, const std::vector<float>& in, std::vector<float>& out,
                        bool forward_dir, bool overlap) {
  wait();
  const int p = g_.size;
  auto sc = rank_totals(forward_dir ? s.send_counts : s.recv_counts, p, L_, D_);
  auto rc = rank_totals(forward_dir ? s.recv_counts : s.send_counts, p, L_, D_);
  out.resize(std::accumulate(rc.begin(), rc.end(), std::size_t(0)));
  if (p == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return;
  }
  for (int j = 0; j < p; ++j)
    if (j != g_.rank) g_.shared->alltoall_bytes += double(sc[j]) * sizeof(float);
  t0_ = Clock::now();
  if (!overlap) {
    alltoallv(in.data(), sc, packed_displs(sc), out.data(), rc, packed_displs(rc), DType::f32, g_.comm);
    const double t = since(t0_);
    g_.shared->alltoall_wait_s += t;
    g_.shared->alltoall_span_s += t;
    return;
  }
  received_ = false;
  req_ = alltoallv_start(in.data(), sc, packed_displs(sc), out.data(), rc, packed_displs(rc), DType::f32, g_.comm);
  g_.shared->alltoall_wait_s += since(t0_);
  open_ = true;
}

void RowExchange::progress() {
  if (!open_) return;
  const auto t0 = Clock::now();
  req_.progress();
  g_.shared->alltoall_wait_s += since(t0);
}

void RowExchange::wait_received() {
  if (!open_ || received_) return;
  const auto t0 = Clock::now();
  req_.wait_received();
  g_.shared->alltoall_wait_s += since(t0);
  g_.shared->alltoall_span_s += since(t0_);
  received_ = true;
}

void RowExchange::wait() {
  if (!open_) return;
  const auto t0 = Clock::now();
  const bool received = received_;
  req_.wait();
  g_.shared->alltoall_wait_s += since(t0);
  if (!received) g_.shared->alltoall_span_s += since(t0_);
  open_ = received_ = false;
}

}  // namespace ringtrain::detail
