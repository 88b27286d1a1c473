#pragma once
// The trainer's pipeline path (parallel.pipeline > 1): a DP x PP grid, one
// PipelineModel per rank, the same loader, schedule, reporter, evaluation and
// checkpoints as the data-parallel path (trainer.cpp), which stays untouched.
//
// Data: every stage of a replica opens the loader over the data-parallel group,
// so all stages of a replica see the same batches; the first uses the images,
// the last the labels. Checkpoints hold the whole model per parameter
// ("param/<name>", "buffer/<name>", "optim/<slot>/<name>", the layout of
// CONTRACTS.md): world rank 0 gathers every stage's names (from DP rank 0)
// and writes; on load each rank reads the file and takes the names it owns,
// so a checkpoint resumes at any pipeline and DP size.
#include <memory>
#include <string>

#include "ringtrain/train/trainer.hpp"

namespace ringtrain {

class PipelineTrainer {
 public:
  PipelineTrainer(const TrainConfig& cfg, const Communicator& world, const TrainerHooks& hooks);
  ~PipelineTrainer();
  TrainResult fit();
  EvalResult evaluate(const std::string& path);
  void load(const std::string& path, bool with_optimizer);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringtrain
