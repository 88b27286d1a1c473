#pragma once
// Trainer: one trainer for every layout of the DP x PP x TP process grid
// (data parallelism is the grid with one stage and one tensor shard). A rank
// builds only its own stage and shard and the parts that train them
// (parallel/parts.hpp). A step reads like the algorithm (parallel/parts.cpp):
//
//   out = executor.run(stage, {batches, step, lr}, grad_sync)   the schedule's
//         forwards and backwards; each layer's gradient goes to grad_sync as
//         soon as the step's last backward made it (overlapping the rest)
//   grad_sync.finish()        gradients averaged (or ZeRO-1: reduce-scattered)
//   updater.apply(lr)         fp16 unscale/skip, clipping, the optimizer step
//   stats = reduce(out.stats) loss, accuracy and the stop/checkpoint flags, one all-reduce
//
// Every feature (precision, accumulation, ZeRO-1, clipping, dropout, exact
// resume, comm.deterministic, the CUDA device) is the same code on every layout.
//
// Rules: every rank runs the same number of steps (the loader guarantees equal
// batch counts); rank 0's initial parameters and optimizer state are broadcast
// before the first step; a failure on one rank becomes an Error on every rank
// (collective checks) or ends the job with a message naming the rank.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/train/config.hpp"
#include "ringtrain/train/report.hpp"

namespace ringtrain {

class ParamArena;

struct EvalResult {
  double loss = 0, accuracy = 0;
  std::int64_t samples = 0;
};

struct TrainResult {
  EpochMetrics last;
  double best_test_accuracy = 0;
  int target_epoch = -1;      // first epoch (1-based) reaching train.target_accuracy, -1 if never
  double target_time_s = 0;   // wall time from start of training until then
  std::int64_t steps = 0;
  // Non-zero: the run stopped early on this signal (SIGTERM, SIGUSR1, SIGINT)
  // after writing a checkpoint at the exact position; the CLI exits with 75.
  int stopped_by_signal = 0;
  std::string checkpoint;     // the last checkpoint written ("" if none)
  // Checkpoints written by fit() and the time training paused for them on this
  // rank (gather, host snapshot; with checkpoint.async not the write itself).
  std::vector<double> checkpoint_stalls_s;  // one per checkpoint, in order
  // checkpoint.memory_every_steps: how long each snapshot paused training
  // (waiting for the previous one, then the copy), and this rank's last snapshot's bytes.
  std::vector<double> memory_stalls_s;
  std::vector<double> memory_helper_s;  // each snapshot's time on the helper thread (this rank)
  std::size_t memory_bytes = 0;
};

struct TrainerHooks {
  bool evaluate = true;       // evaluate on the test split after every epoch
  bool report = true;         // progress output and metrics file
  // Benchmarks only: skip the gradient all-reduce (compute-alone baseline).
  bool skip_allreduce = false;
  // Called on every rank after each optimizer step with the global mean loss.
  std::function<void(std::int64_t step, double loss)> on_step;
  // Polled once per step: a pending stop signal's number, or 0 (the CLI passes
  // StopSignals::pending; null = never stop). Ranks agree on it at the step's end.
  std::function<int()> stop_signal;
  // Tests only: called on this rank inside each optimizer step's compute
  // (counted as compute), e.g. to make one rank a straggler.
  std::function<void(std::int64_t step)> in_step;
  // Tests only: called after each tensor written to a checkpoint (throw to inject a write error).
  std::function<void(const std::string&)> checkpoint_write_hook;
  // GPU tests only: features off the GPU validation gate's list (train/gpu_gate.hpp)
  // that this trainer runs on CUDA anyway, so that a GPU session can verify them.
  std::vector<std::string> gpu_trial;
  // GPU tests only: keep float32 activations on CUDA with 16-bit arithmetic (the gate's fallback for 16-bit
  // storage it does not list), as the reference a 16-bit storage test compares with.
  bool gpu_float32_storage = false;
};

// Bytes one rank holds (Trainer::memory).
struct TrainerMemory {
  std::size_t params = 0, grads = 0, optimizer = 0;
  std::size_t grads_in_flight = 0;     // ZeRO-2: full-buffer bytes of the buckets in flight (GridMemory)
  std::size_t params_in_flight = 0;    // ZeRO-3: gathered parameter bytes resident at once (GridMemory)
  std::int64_t param_count = 0;        // this rank's parameters
  std::int64_t model_param_count = 0;  // the whole model's
};

// A checkpoint that was loaded: its file, run and position, and what this
// rank read of it (its own share: checkpoint/read.hpp).
struct LoadedCheckpoint {
  std::string file, run_id;
  std::int64_t step = 0, epochs_done = 0, step_in_epoch = 0;
  std::size_t restored_bytes = 0;  // read into this rank's state
  std::size_t verified_bytes = 0;  // read to verify the pieces dealt to this rank
};

class Trainer {
 public:
  Trainer(TrainConfig cfg, Communicator world, TrainerHooks hooks = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Continues from a checkpoint file, or the newest intact one in a directory
  // (saying which newer ones it skipped and why). "auto": the newest intact
  // checkpoint of this configuration and layout in checkpoint.dir, or a fresh
  // start (returns false then). A path may come from any layout (the global
  // batch, accumulation and seed must match); an incompatible checkpoint is an
  // Error naming the key or tensor (src/train/checkpoint_session.hpp).
  bool resume(const std::string& path);
  TrainResult fit();
  // Evaluates the current parameters on a split, spread across ranks.
  EvalResult evaluate(const std::string& path);
  // Loads parameters (and buffers) from a checkpoint file or directory.
  LoadedCheckpoint load_weights(const std::string& path);
  // What the last resume() or load_weights() read.
  const LoadedCheckpoint& loaded() const;
  // Writes a checkpoint of the state as it stands into checkpoint.dir now
  // (collective); returns its path on rank 0, "" elsewhere.
  std::string save_checkpoint();
  // What this rank holds: its stage's and shard's parameters, their
  // gradients, and its optimizer state (its slices with parallel.zero).
  TrainerMemory memory() const;
  // This rank's parameters (its pipeline stage and tensor shard). With
  // parallel.zero = 3 they are gathered whole first: collective over the
  // data-parallel group, and resident until the next step releases them.
  ParamArena& parameters();

  const std::string& run_id() const;  // set by resume() or at the start of fit()
  const TrainConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringtrain
