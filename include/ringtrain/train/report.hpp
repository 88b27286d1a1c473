#pragma once
// What a run tells people: a progress bar on a terminal, plain periodic lines
// when not on one (sbatch logs) or, with log.format = json, the same records
// as JSON lines on stderr (every log.interval steps: {"event":"step", "step",
// "loss" at full precision, ...}; each epoch: the metrics record), and one
// JSON object per epoch in a metrics file for plots and scaling studies.
// Only the root rank reports.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <array>
#include <string>
#include <vector>

namespace ringtrain {

// One MoE layer over an epoch's training forwards, every rank's micro-batches (nn/moe.hpp).
struct MoeEpochStats {
  std::string layer;            // "blocks.0.moe"
  double aux = 0;               // mean load-balancing loss E sum f_i P_i (1 = balanced)
  double max_over_mean = 0;     // mean over micro-batches of max / mean tokens per expert
  double epoch_max_over_mean = 0;  // max / mean of the epoch's tokens per expert (summed over micro-batches and ranks)
  double dropped_fraction = 0;  // of the top-k assignments, dropped by model.capacity_factor
};

struct EpochMetrics {
  int epoch = 0;
  std::int64_t step = 0;          // optimizer steps so far
  double lr = 0;
  double train_loss = 0, train_accuracy = 0;
  bool evaluated = false;         // test_* hold values (no --no-eval)
  double test_loss = 0, test_accuracy = 0;
  double images_per_s = 0;        // global (all ranks): samples (a language model's sequences) per second
  std::int64_t tokens_per_sample = 0;  // language models: data.seq_len (tokens/s, perplexity); 0: images
  double model_flops_per_s = 0;   // language models: 3 x forward matmul FLOPs (attention included) per second
  double matmul_peak_flops = 0;   // the ranks' measured float32 matmul peak, summed (MFU = the ratio)
  double time_s = 0;              // wall time of the epoch's training part
  double compute_s = 0;           // forward + backward + optimizer (root rank)
  double comm_exposed_s = 0;      // time blocked on gradient all-reduce, not hidden by compute
  double pipeline_wait_s = 0;     // time waiting for other pipeline stages (the bubble; 0 without a pipeline)
  // Pipeline: the schedule's mean step (executor only: no gradient sync or
  // update), and the simulator's prediction from this epoch's per-chunk costs
  // and the link (measured by ScheduleExecutor::measure_link, or given by
  // parallel.link_latency_us), and with a free link (the rendezvous sends'
  // waits for a computing receiver still charged: simulator.hpp); the first
  // boundary's message time; 0 without a pipeline.
  double schedule_s = 0, schedule_predicted_s = 0, schedule_bubble_predicted = 0;
  // Per global pipeline stage (chunk): the epoch's mean forward, input-gradient and
  // weight-gradient seconds per micro-batch, the simulator's inputs (log.metrics only).
  std::vector<std::array<double, 4>> schedule_stage_fiw;  // per stage: F, I, W and a whole B (0: none ran)
  double schedule_predicted_free_s = 0, pipeline_message_s = 0;
  // The mean over the epoch's steps (its last 1024) of each step played with
  // that step's own chunk costs and the link: what the steps' variation adds.
  double schedule_predicted_steps_s = 0;
  // Medians over the same steps: the measured step (its slowest stage) and
  // the per-step plays; and the busiest rank's compute at the epoch's mean
  // costs (simulator.hpp busiest_rank_s: no table of this cut runs faster).
  double schedule_median_s = 0, schedule_predicted_steps_median_s = 0, schedule_busiest_s = 0;
  double data_wait_s = 0;         // time blocked on the loader
  double eval_s = 0;
  std::int64_t skipped_steps = 0;  // fp16: steps skipped for inf/NaN gradients
  double loss_scale = 0;           // fp16: the loss scale at the epoch's end (0 = none)
  // The rank whose compute was slowest against its peers' median (train/straggler.hpp).
  int slowest_rank = -1;            // -1: no rank has a peer to compare with
  double slowest_slowdown = 0;      // its compute seconds / the median of its peers'
  double slowest_wait_fraction = 0; // of its peers' step time, spent waiting on it
  bool straggler = false;           // slowest_slowdown > comm.straggler_factor
  std::vector<MoeEpochStats> moe;   // model.experts > 0: per MoE layer
  // parallel.expert > 1: the epoch's seconds this rank was blocked in the experts'
  // all-to-alls (exposed: not hidden behind expert compute), and from each
  // exchange's start to its completion (span); the busiest rank's each.
  double moe_alltoall_s = 0, moe_alltoall_span_s = 0;
};

struct SlowestRank;

// What the progress line shows beside the loss and the rate (0 / -1: not known).
struct StepLive {
  double mfu = 0;               // model FLOP/s over the measured matmul peak
  double peak_bytes = 0;        // the largest rank's peak of live host tensor bytes (rank 0's own
                                // with comm.straggler_factor = 0, which gathers nothing)
  int slowest_rank = -1;        // the latest interval's slowest rank and its slowdown
  double slowest_slowdown = 0;
};

class Reporter {
 public:
  // format: auto | bar | plain | json. metrics_path "" = no metrics file.
  Reporter(bool root, const std::string& format, int interval, const std::string& metrics_path, int epochs,
           std::int64_t steps_per_epoch);
  ~Reporter();
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  void epoch_start(int epoch);
  // Token data: progress lines give tokens/s instead of img/s.
  void set_tokens_per_sample(std::int64_t n) { tokens_ = n; }
  void step(std::int64_t step_in_epoch, double loss, double images_per_s, const StepLive& live = StepLive());
  void epoch_end(const EpochMetrics& m);
  // A rank slower than `factor` x its peers' median compute in `intervals`
  // consecutive intervals of `interval` steps, up to `step`: a warning (a
  // JSON record with log.format = json) and a metrics-file record.
  void straggler(const SlowestRank& s, std::int64_t step, int intervals, int interval, double factor);
  // Every record carries "run" (the run id) and "resume" (0 for a fresh run,
  // k after the k-th resume), so a reader can tell runs and resumes apart.
  void set_run(const std::string& run_id, std::int64_t resumes);
  // A JSON object written as one line of the metrics file (e.g. the run's header), run tags added.
  void json_line(nlohmann::json j);

 private:
  bool root_, bar_, json_ = false;
  std::int64_t tokens_ = 0;
  int interval_, epochs_, epoch_ = 0;
  std::int64_t steps_;
  std::FILE* metrics_ = nullptr;
  std::chrono::steady_clock::time_point epoch_t0_;
  std::string run_id_;
  std::int64_t resumes_ = 0;
};

}  // namespace ringtrain
