// comm.autotune inside the engine: step detection, the α-β probe, sampling,
// agreement across ranks and the CSV log (see autotune_session.hpp).
#include "autotune_session.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain::engine {

namespace {
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

AutotuneSession::AutotuneSession(const Communicator& comm, EngineOptions& opts) : comm_(comm), opts_(opts) {
  const auto& a = opts_.autotune;
  RT_CHECK(a.samples >= 3, "comm.autotune_samples must be >= 3 (a baseline and two confirmations), got ", a.samples);
  RT_CHECK(a.steps_per_sample >= 2, "comm.autotune_steps must be >= 2 (the first step after a change is discarded), got ",
           a.steps_per_sample);
  std::string err;
  if (comm_.rank() == 0 && !a.log.empty()) {
    log_ = std::fopen(a.log.c_str(), "w");
    if (!log_) err = std::strerror(errno);
    else
      std::fprintf(log_, "sample,candidate,fusion_threshold,cycle_time_ms,small_algorithm,large_algorithm,why,"
                         "model_step_ms,predicted_step_ms,measured_step_ms,chosen\n");
  }
  int bad = err.empty() ? 0 : 1;
  bounded::allreduce(&bad, 1, MPI_INT, MPI_MAX, WaitOn(comm_, "Engine start-up"), "Engine start-up");
  RT_CHECK(!bad, "Engine: rank 0 could not open the autotune log (comm.autotune_log = '", a.log, "')",
           err.empty() ? "" : ": ", err);
}

AutotuneSession::~AutotuneSession() {
  if (log_) std::fclose(log_);
}

Algorithm AutotuneSession::algorithm_for(std::size_t bytes) const {
  if (!tuned_algorithms_) return opts_.collective.algorithm;
  return static_cast<long long>(bytes) <= grid_.split ? current_.small : current_.large;
}

void AutotuneSession::after_batch(const Batch& b) {
  if (state_ == State::done) return;
  if (b.device != DeviceKind::cpu) {  // the same batches on every rank: all stop here
    if (comm_.rank() == 0) log::warn("comm.autotune: tunes host collectives only; this job reduces device tensors");
    state_ = State::done;
    return;
  }
  for (auto& op : b.ops) {
    const std::size_t bytes = static_cast<std::size_t>(op->input.numel()) * dtype_size(b.wire);
    if (state_ == State::learn) {
      if (names_.count(op->name)) {  // step one ended before this tensor: the same point on every rank
        period_ = names_.size();
        steps_ = 1;
        last_boundary_ = Clock::now();
        cur_step_.clear();
        state_ = State::probe;
      } else {
        names_.insert(op->name);
        step_bytes_ += bytes;
      }
    }
    cur_step_.push_back({op->submitted, bytes});
    ++reduced_;
  }
  if (period_ && reduced_ >= static_cast<std::size_t>(steps_ + 1) * period_) {
    ++steps_;
    last_step_.swap(cur_step_);
    cur_step_.clear();
    at_boundary(Clock::now());
  }
}

void AutotuneSession::at_boundary(Clock::time_point now) {
  const double period = seconds(now - last_boundary_);
  if (state_ == State::probe) {
    probe();
    TuneSetting conf{opts_.fusion_threshold, opts_.cycle_time_ms,
                     choose_algorithm(grid_.split, comm_.size(), opts_.collective, comm_.node_count(),
                                      comm_.max_local_size()),
                     choose_algorithm(grid_.split + 1, comm_.size(), opts_.collective, comm_.node_count(),
                                      comm_.max_local_size())};
    base_ = grid_.nearest(conf);
    apply(base_);
    state_ = State::sample;
  } else if (state_ == State::sample) {
    if (++sample_steps_ > 1) periods_.push_back(period);
    if (sample_steps_ == opts_.autotune.steps_per_sample) end_sample();
  }
  last_boundary_ = Clock::now();  // the session's own collectives do not count as step time
}

// α-β per algorithm on the engine's communicator: 3 sizes, the fastest of 2
// timed calls after a warm-up, the slowest rank's time.
void AutotuneSession::probe() {
  grid_ = default_tune_grid(step_bytes_, comm_.size(), comm_.node_count(), comm_.max_local_size());
  const std::size_t big = std::clamp<std::size_t>(step_bytes_, std::size_t{1} << 20, std::size_t{2} << 20);
  const std::vector<std::size_t> sizes{4096, 256 << 10, big};
  std::vector<float> buf(big / sizeof(float), 0.0f);
  std::vector<double> t;
  const WaitOn h(comm_, "comm.autotune probe");
  for (Algorithm a : grid_.algos) {
    CollectiveOptions copt = opts_.collective;
    copt.algorithm = a;
    for (std::size_t bytes : sizes) {
      double best = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        bounded::barrier(h, "comm.autotune probe");
        auto t0 = Clock::now();
        allreduce(buf.data(), buf.data(), bytes / sizeof(float), DType::f32, ReduceOp::sum, comm_, copt);
        if (rep) best = std::min(best, seconds(Clock::now() - t0));
      }
      t.push_back(best);
    }
  }
  bounded::allreduce(t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX, h, "comm.autotune probe");
  fits_.clear();
  for (std::size_t i = 0; i < grid_.algos.size(); ++i)
    fits_.push_back(fit_alpha_beta(grid_.algos[i], sizes, {t.begin() + i * 3, t.begin() + i * 3 + 3}));
  if (log_) {
    std::fprintf(log_, "# %d ranks, %zu tensors and %zu bytes per step, %d candidates; probed all-reduce fits:",
                 comm_.size(), period_, step_bytes_, grid_.size());
    for (auto& f : fits_)
      std::fprintf(log_, " %s alpha %.1f us beta %.3f ns/B;", algorithm_name(f.algo), f.alpha_s * 1e6, f.beta_s * 1e9);
    std::fprintf(log_, "\n");
  }
}

void AutotuneSession::end_sample() {
  const WaitOn h(comm_, "comm.autotune");
  bounded::allreduce(periods_.data(), static_cast<int>(periods_.size()), MPI_DOUBLE, MPI_MAX, h, "comm.autotune");
  const double cost = sample_cost(periods_);
  int next = 0;
  ++samples_;  // every rank counts the samples
  if (comm_.rank() == 0) {
    if (!tuner_) {  // the baseline: seeds the model with this job's step
      StepProfile p;
      for (auto& [at, bytes] : last_step_) {
        p.submit_s.push_back(seconds(at - last_step_.front().first));
        p.bytes.push_back(bytes);
      }
      p.step_s = cost;
      tuner_ = std::make_unique<Autotuner>(grid_.dims(), predict_steps(p, grid_, base_, fits_),
                                           opts_.autotune.samples, base_);
    }
    const double predicted = tuner_->predicted(candidate_);
    const char* why = tuner_->why(candidate_);
    tuner_->record(candidate_, cost);
    log_row(samples_, candidate_, cost * 1e3, predicted, why);
    next = tuner_->next();
    if (next < 0) next = -1 - tuner_->best();
  }
  bounded::bcast(&next, 1, MPI_INT, 0, h, "comm.autotune");
  periods_.clear();
  sample_steps_ = 0;
  if (next >= 0) {
    apply(next);
    return;
  }
  apply(-1 - next);
  state_ = State::done;
  {
    std::lock_guard lk(result_mu_);
    result_.finished = true;
    result_.samples = samples_;
  }
  if (comm_.rank() == 0) {
    const int c = candidate_;
    log_row(0, c, tuner_->measured(c) * 1e3, tuner_->predicted(c), nullptr);
    log::info("comm.autotune: chose fusion_threshold ", current_.fusion_threshold, " B, cycle_time_ms ",
              current_.cycle_time_ms, ", ", algorithm_name(current_.small), " up to ", grid_.split, " B and ",
              algorithm_name(current_.large), " above, after ", tuner_->samples(), " samples: step ",
              tuner_->measured(c) * 1e3, " ms (the configured setting: ", tuner_->measured(base_) * 1e3, " ms)");
  }
}

void AutotuneSession::apply(int c) {
  candidate_ = c;
  current_ = grid_.at(c);
  opts_.fusion_threshold = current_.fusion_threshold;
  opts_.cycle_time_ms = current_.cycle_time_ms;
  tuned_algorithms_ = true;
  std::lock_guard lk(result_mu_);
  result_.setting = current_;
}

void AutotuneSession::log_row(int sample, int c, double measured_ms, double predicted_s, const char* why) {
  if (!log_) return;
  const bool chosen = why == nullptr;
  const TuneSetting s = grid_.at(c);
  std::fprintf(log_, "%d,%d,%zu,%g,%s,%s,%s,%.4f,%.4f,%.4f,%d\n", sample, c, s.fusion_threshold, s.cycle_time_ms,
               algorithm_name(s.small), algorithm_name(s.large), chosen ? "chosen" : why,
               tuner_->prior(c) * 1e3, predicted_s * 1e3, measured_ms, chosen ? 1 : 0);
  std::fflush(log_);
}

}  // namespace ringtrain::engine
