#include "ringtrain/train/straggler.hpp"

#include "ringtrain/core/allocator.hpp"

#include <algorithm>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/train/report.hpp"

namespace ringtrain {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int> peers_of(const std::vector<RankTimes>& t, int rank) {
  std::vector<int> p;
  for (int r = 0; r < static_cast<int>(t.size()); ++r)
    if (r != rank && t[r].stage == t[rank].stage) p.push_back(r);
  return p;
}

}  // namespace

std::vector<RankTimes> gather_rank_times(const RankTimes& mine, const Communicator& world) {
  const int n = world.size();
  std::vector<double> v(4 * static_cast<std::size_t>(n), 0.0);  // each rank fills its slots; the sum gathers
  v[4 * world.rank()] = mine.compute_s;
  v[4 * world.rank() + 1] = mine.wait_s;
  v[4 * world.rank() + 2] = mine.stage;
  v[4 * world.rank() + 3] = mine.peak_bytes;
  allreduce(v.data(), v.data(), v.size(), DType::f64, ReduceOp::sum, world);
  std::vector<RankTimes> t(n);
  for (int r = 0; r < n; ++r) t[r] = {v[4 * r], v[4 * r + 1], static_cast<int>(v[4 * r + 2]), v[4 * r + 3]};
  return t;
}

SlowestRank describe_rank(const std::vector<RankTimes>& t, int rank) {
  const std::vector<int> peers = peers_of(t, rank);
  SlowestRank s;
  if (peers.empty()) return s;
  std::vector<double> c;
  for (int p : peers) c.push_back(t[p].compute_s);
  s.rank = rank;
  s.compute_s = t[rank].compute_s;
  s.peer_median_s = median(c);
  s.slowdown = s.compute_s / std::max(s.peer_median_s, 1e-9);
  // The rank itself waits only for the communication proper; what its peers wait beyond that is waiting on it.
  double sum = 0;
  for (int p : peers) {
    const double step = t[p].compute_s + t[p].wait_s;
    if (step > 0) sum += std::max(0.0, t[p].wait_s - t[rank].wait_s) / step;
  }
  s.wait_fraction = sum / peers.size();
  return s;
}

std::vector<double> slowdowns(const std::vector<RankTimes>& t) {
  std::vector<double> s(t.size(), 0.0);
  for (int r = 0; r < static_cast<int>(t.size()); ++r) s[r] = describe_rank(t, r).slowdown;
  return s;
}

SlowestRank find_slowest(const std::vector<RankTimes>& t) {
  SlowestRank best;
  for (int r = 0; r < static_cast<int>(t.size()); ++r) {
    SlowestRank s = describe_rank(t, r);
    if (s.rank >= 0 && (best.rank < 0 || s.slowdown > best.slowdown)) best = s;
  }
  if (best.compute_s <= 0) return {};  // no step timed (an epoch resumed at its end): nothing to say
  return best;
}

std::vector<int> StragglerStreaks::update(const std::vector<double>& slowdown) {
  streak_.resize(slowdown.size(), 0);
  std::vector<int> reached;
  for (int r = 0; r < static_cast<int>(slowdown.size()); ++r) {
    if (factor_ > 0 && slowdown[r] > factor_) {
      if (++streak_[r] == intervals_) reached.push_back(r);
    } else {
      streak_[r] = 0;
    }
  }
  return reached;
}

void StragglerMonitor::after_step(std::int64_t step, double compute_s, double wait_s, const Communicator& world,
                                  Reporter& reporter) {
  // Every rank takes the same branches (same factor, size and step): the all-reduce below is matched.
  if (factor_ <= 0 || world.size() == 1) {  // no collective: this rank's own peak
    last_peak_ = static_cast<double>(host_memory_stats().peak);
    return;
  }
  acc_.compute_s += compute_s;
  acc_.wait_s += wait_s;
  const bool interval_end = step % interval_ == 0;
  // Step 1 is looked at too, for the progress line only: it counts toward no streak and stays in the interval.
  if (!interval_end && step != 1) return;
  acc_.stage = stage_;
  acc_.peak_bytes = static_cast<double>(host_memory_stats().peak);
  const std::vector<RankTimes> t = gather_rank_times(acc_, world);
  last_ = find_slowest(t);
  last_peak_ = 0;
  for (const RankTimes& r : t) last_peak_ = std::max(last_peak_, r.peak_bytes);
  if (!interval_end) return;
  acc_ = {};
  for (int r : streaks_.update(slowdowns(t)))
    reporter.straggler(describe_rank(t, r), step, kStragglerIntervals, interval_, factor_);
}

SlowestRank StragglerMonitor::epoch(double compute_s, double wait_s, const Communicator& world) const {
  if (world.size() == 1) return {};
  return find_slowest(gather_rank_times({compute_s, wait_s, stage_}, world));
}

}  // namespace ringtrain
