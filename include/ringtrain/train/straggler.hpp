#pragma once
// Stragglers: a rank whose compute is slower than its peers' makes every
// other rank wait for it in the gradient all-reduce (or the pipeline's
// receives). Definitions, used by the epoch record and the warning:
//  - peers: the ranks holding the same pipeline stage (same layers, same
//    micro-batches, so the same work); stages are not compared with each
//    other, since a partition may be uneven on purpose (that is the bubble,
//    reported as pipeline_wait_s). A rank without peers is never named.
//  - slowdown of a rank: its compute seconds (forward, backward, optimizer)
//    over the median of its peers' (the others, not itself: with 2 ranks the
//    median of both would halve a straggler's ratio).
//  - the slowest rank: the largest slowdown (ties: the lowest rank).
//  - wait fraction: how much longer its peers waited (exposed all-reduce +
//    pipeline wait) than it did, as a fraction of their step time, averaged
//    over its peers: the share of the step the others spent waiting on it.
//  - warning: every log.interval optimizer steps the ranks' compute seconds
//    over those steps are gathered (one small all-reduce); a rank whose
//    slowdown exceeds comm.straggler_factor in kStragglerIntervals
//    consecutive intervals is named in a warning on rank 0, once per streak.
#include <cstdint>
#include <vector>

#include "ringtrain/comm/communicator.hpp"

namespace ringtrain {

inline constexpr int kStragglerIntervals = 3;

// One rank's seconds over an epoch or an interval.
struct RankTimes {
  double compute_s = 0;  // forward, backward, optimizer
  double wait_s = 0;     // exposed all-reduce + pipeline wait
  int stage = 0;         // pipeline stage: ranks are compared within a stage
  double peak_bytes = 0; // the rank's peak of live host tensor bytes (core/allocator.hpp)
};

struct SlowestRank {
  int rank = -1;             // -1: no rank has a peer to compare with (1 rank, one rank per stage), or no step was timed
  double slowdown = 0;       // its compute over the median of its peers'
  double compute_s = 0, peer_median_s = 0;
  double wait_fraction = 0;  // of its peers' step time, spent waiting on it
};

// Every rank's times, on every rank (collective: one all-reduce of 4 x ranks doubles).
std::vector<RankTimes> gather_rank_times(const RankTimes& mine, const Communicator& world);

// Each rank's slowdown against its peers (0 for a rank without peers).
std::vector<double> slowdowns(const std::vector<RankTimes>& t);
// One rank against its peers (rank -1 in the result when it has none).
SlowestRank describe_rank(const std::vector<RankTimes>& t, int rank);
SlowestRank find_slowest(const std::vector<RankTimes>& t);

// Counts, per rank, the consecutive intervals whose slowdown exceeded the factor.
class StragglerStreaks {
 public:
  explicit StragglerStreaks(double factor, int intervals = kStragglerIntervals)
      : factor_(factor), intervals_(intervals) {}
  // One interval's slowdowns; returns the ranks whose streak just reached `intervals`.
  std::vector<int> update(const std::vector<double>& slowdown);
  int streak(int rank) const { return rank < static_cast<int>(streak_.size()) ? streak_[rank] : 0; }

 private:
  double factor_;
  int intervals_;
  std::vector<int> streak_;
};

class Reporter;

// The trainer's side. after_step on every rank after every optimizer step
// (collective every `interval` steps, none at all when factor = 0: off);
// epoch() at an epoch's end (collective).
class StragglerMonitor {
 public:
  StragglerMonitor(double factor, int interval, int stage) : factor_(factor), interval_(interval), stage_(stage),
                                                            streaks_(factor) {}
  void after_step(std::int64_t step, double compute_s, double wait_s, const Communicator& world, Reporter& reporter);
  SlowestRank epoch(double compute_s, double wait_s, const Communicator& world) const;
  double factor() const { return factor_; }
  // The latest interval's slowest rank and largest peak of host tensor bytes
  // over the ranks (the first interval is step 1 alone, so the progress line
  // has them from the first step); rank -1 before it or without peers.
  const SlowestRank& last_slowest() const { return last_; }
  double last_peak_bytes() const { return last_peak_; }

 private:
  double factor_;
  int interval_, stage_;
  StragglerStreaks streaks_;
  RankTimes acc_;                  // this rank's seconds since the last interval check
  std::int64_t since_step_ = -1;   // the first step of the current interval
  SlowestRank last_;
  double last_peak_ = 0;
};

}  // namespace ringtrain
