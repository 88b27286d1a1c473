#pragma once
// Autotuning of the fusion engine (comm.autotune): during the first steps of a
// job the engine measures candidate settings (fusion threshold, cycle time,
// all-reduce algorithm for small and for large buffers) and keeps the best.
//
// The search is model-based: a cost model of one training step (the job's own
// gradient sizes and submission times, α-β all-reduce times per algorithm
// probed on the engine's communicator) ranks the whole grid; measured step
// times correct it (a per-dimension multiplicative term fitted in log space
// over every sample, Huber-weighted so that outliers count little), and the
// next candidate is the one the corrected model predicts fastest, with a bonus
// for settings not tried yet. Noise decides nothing alone: a candidate's score
// is the corrected model moved towards its own samples by n / (n + 2); the two
// best scores are measured in turn at the end (3 samples each, budget
// permitting) and the best score then wins.
//
// Everything here is deterministic: given the same measurements, every rank
// would choose the same. The engine still decides on rank 0 only (from step
// times max-reduced over ranks) and broadcasts the choice.
#include <cstddef>
#include <string>
#include <vector>

#include "ringtrain/comm/collectives.hpp"

namespace ringtrain {

struct AutotuneOptions {
  bool enabled = false;      // comm.autotune
  int samples = 20;          // comm.autotune_samples: candidate measurements at most (>= 3)
  int steps_per_sample = 3;  // comm.autotune_steps: steps per measurement; the first after a change is discarded
  std::string log;           // comm.autotune_log: CSV written by rank 0 ("" = none)
};

// One point of the search: the engine settings it changes.
struct TuneSetting {
  std::size_t fusion_threshold = 0;
  double cycle_time_ms = 1.0;
  Algorithm small = Algorithm::automatic;  // all-reduces of <= split bytes
  Algorithm large = Algorithm::automatic;  // above
};

// What the engine's autotuning did (Engine::autotune_result()).
struct AutotuneResult {
  bool finished = false;  // the search ended and `setting` is applied for good
  int samples = 0;        // settings measured
  TuneSetting setting;    // the setting in use
};

// The candidates: the product of the value lists (fusion fastest-varying).
struct TuneGrid {
  std::vector<std::size_t> fusion;
  std::vector<double> cycle_ms;
  std::vector<Algorithm> algos;  // for `small` and for `large`
  long long split = kDefaultTreeThreshold;

  int size() const;
  std::vector<int> dims() const;  // {fusion, cycle, small, large}
  std::vector<int> coords(int i) const;
  TuneSetting at(int i) const;
  int nearest(const TuneSetting& s) const;  // the grid point closest to s (per dimension)
};

// The grid the engine searches for one job: fusion thresholds from 256 KiB up
// to the first power of 4 >= the gradient bytes of a step; cycle times of
// 0.5-5 ms; ring and tree, plus shm (one node, several ranks) or hierarchical
// (several nodes with several ranks on one).
TuneGrid default_tune_grid(std::size_t step_bytes, int ranks, int nodes, int max_local);

// The search over candidate indices 0..n-1 (see the file comment).
class Autotuner {
 public:
  // dims: values per dimension (the candidate's coordinates are mixed-radix,
  // dims[0] fastest); prior: the model's predicted cost per candidate (empty =
  // all equal); budget: measurements at most; first: the candidate measured
  // first (the configured setting).
  Autotuner(std::vector<int> dims, std::vector<double> prior, int budget, int first);
  int next() const { return next_; }  // the candidate to measure now; -1 once done
  void record(int candidate, double cost);
  bool done() const { return next() < 0; }
  int best() const;                   // the measured candidate with the lowest score()
  double predicted(int c) const;      // the corrected model's cost of c
  double score(int c) const;          // predicted(c) moved towards c's own measurements
  double prior(int c) const { return prior_[c]; }
  double measured(int c) const;       // the lowest of c's measurements (NaN if none)
  int samples() const { return static_cast<int>(history_.size()); }
  const char* why(int c) const;       // "baseline" | "model" | "explore" | "confirm"

 private:
  std::vector<int> coords(int c) const;
  void refit();
  int choose() const;
  std::vector<int> dims_, offset_;
  std::vector<double> prior_, w_;  // w_: log-space correction per (dimension, value)
  std::vector<std::vector<double>> costs_;  // per candidate, its measurements
  std::vector<std::pair<int, double>> history_;
  std::vector<const char*> why_;
  int budget_, first_, next_ = -1;
};

// One sample's cost from its counted step periods (each max-reduced over
// ranks). Load on a shared machine only adds time to a step, so the fastest
// step is the closest to the setting's own cost.
double sample_cost(const std::vector<double>& step_s);

// The step cost model. One step's gradients as the engine saw them: bytes
// and submission time (seconds after the step's first submission), in
// submission order, and the step's measured period.
struct StepProfile {
  std::vector<double> submit_s;
  std::vector<std::size_t> bytes;
  double step_s = 0;
};
// All-reduce time fit per algorithm: t = alpha + beta * bytes.
struct AlphaBeta {
  Algorithm algo = Algorithm::ring;
  double alpha_s = 0, beta_s = 0;
};
// Communication a step cannot hide under setting s: the time from the last
// submission until the last gradient is reduced, simulating the engine's
// cycles (every cycle_time, the tensors submitted so far are cut into buffers
// of <= fusion_threshold and reduced one after the other).
double exposed_comm_s(const StepProfile& p, const TuneSetting& s, long long split, const std::vector<AlphaBeta>& fits);
// Predicted step time per candidate: the measured step of `base` with its
// exposed communication replaced by each candidate's.
std::vector<double> predict_steps(const StepProfile& p, const TuneGrid& g, int base, const std::vector<AlphaBeta>& fits);
// Least-squares fit of t = alpha + beta * bytes (both clamped at >= 0).
AlphaBeta fit_alpha_beta(Algorithm a, const std::vector<std::size_t>& bytes, const std::vector<double>& seconds);

}  // namespace ringtrain
