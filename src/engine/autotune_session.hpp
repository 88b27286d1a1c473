#pragma once
// The autotuner inside the engine (comm.autotune): runs on the engine thread,
// after every executed batch.
//
// Steps are found without help from the trainer: tensors are reduced in the
// same order on every rank, so "the first name reduced a second time" ends the
// first step on every rank at the same point, and from then on a step ends
// after every N reductions (N = the distinct names of step one). At those
// points, which all ranks reach in the same order of engine collectives, the
// session may run collectives of its own on the engine's communicator: the
// α-β probe, one MAX all-reduce of the sample's step periods, and the
// broadcast of rank 0's next candidate. Every rank then applies the same
// setting before its next batch.
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "fusion_buffer.hpp"
#include "ringtrain/engine/autotune.hpp"
#include "ringtrain/engine/engine.hpp"

namespace ringtrain::engine {

class AutotuneSession {
 public:
  // `opts` is the engine's live options: the session changes fusion_threshold
  // and cycle_time_ms in it (engine thread only).
  AutotuneSession(const Communicator& comm, EngineOptions& opts);
  ~AutotuneSession();
  // After each batch: its tensors and the time its all-reduce took.
  void after_batch(const Batch& b);
  // The algorithm for an all-reduce of `bytes` under the current setting.
  Algorithm algorithm_for(std::size_t bytes) const;
  AutotuneResult result() const {  // any thread
    std::lock_guard lk(result_mu_);
    return result_;
  }

 private:
  enum class State { learn, probe, sample, done };
  void at_boundary(Clock::time_point now);
  void probe();
  void end_sample();
  void apply(int candidate);
  // why: the tuner's reason for measuring c; nullptr marks the final choice.
  void log_row(int sample, int c, double measured_ms, double predicted_s, const char* why);

  const Communicator& comm_;
  EngineOptions& opts_;
  State state_ = State::learn;
  std::set<std::string> names_;
  std::size_t period_ = 0, reduced_ = 0, step_bytes_ = 0;
  long long steps_ = 0;  // step boundaries passed
  Clock::time_point last_boundary_{};
  // The current step's submissions (for the model's step profile).
  std::vector<std::pair<Clock::time_point, std::size_t>> cur_step_, last_step_;
  TuneGrid grid_;
  std::vector<AlphaBeta> fits_;
  std::unique_ptr<Autotuner> tuner_;  // rank 0 only
  int candidate_ = -1, base_ = -1, sample_steps_ = 0, samples_ = 0;
  std::vector<double> periods_;
  bool tuned_algorithms_ = false;
  TuneSetting current_{};
  std::FILE* log_ = nullptr;
  mutable std::mutex result_mu_;
  AutotuneResult result_;
};

}  // namespace ringtrain::engine
