#pragma once
// Trainer: data-parallel training of one model per rank. The step reads like
// the algorithm (see Trainer::train_step in trainer.cpp):
//
//   for each micro-batch:  logits = model.forward(x)
//                          loss, dlogits = cross_entropy(logits, y)
//                          model.backward(dlogits, on_ready = engine.allreduce_async)
//   engine.wait(all)       # gradients averaged across ranks, mostly while backward ran
//   optimizer.step(schedule.lr(step))
//
// parallel.pipeline > 1 or parallel.tensor > 1 hands everything to
// PipelineTrainer (the grid path); both write the same checkpoints.
// parallel.shard_optimizer (ZeRO-1, src/train/zero.cpp): the all-reduce becomes a
// reduce-scatter after backward, each rank updates its slice, parameters are all-gathered.
//
// Rules: every rank runs the same number of steps (the loader guarantees equal
// batch counts); rank 0's initial parameters and optimizer state are broadcast
// before the first step; a failure on one rank becomes an Error on every rank
// (collective checks) or ends the job with a message naming the rank.
#include <functional>
#include <memory>
#include <string>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/train/config.hpp"
#include "ringtrain/train/report.hpp"

namespace ringtrain {

class Model;
class Optimizer;
class PipelineTrainer;

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
  // Tests only: called after each tensor written to a checkpoint (throw to inject a write error).
  std::function<void(const std::string&)> checkpoint_write_hook;
};

// A checkpoint that was loaded: its file (known on rank 0), run and position.
struct LoadedCheckpoint {
  std::string file, run_id;
  std::int64_t step = 0, epochs_done = 0, step_in_epoch = 0;
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
  // Writes a checkpoint of the state as it stands into checkpoint.dir now
  // (collective); returns its path on rank 0, "" elsewhere.
  std::string save_checkpoint();
  // Bytes of optimizer state this rank holds: its slice with parallel.shard_optimizer
  // (ZeRO-1), the whole state otherwise.
  std::size_t optimizer_state_bytes() const;

  const std::string& run_id() const;  // set by resume() or at the start of fit()
  Model& model();
  const TrainConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;              // parallel.pipeline = 1: data parallelism
  std::unique_ptr<PipelineTrainer> pipe_;   // parallel.pipeline > 1 (src/train/pipeline_trainer.hpp)
  TrainConfig cfg_;                         // pipe_'s configuration
};

}  // namespace ringtrain
