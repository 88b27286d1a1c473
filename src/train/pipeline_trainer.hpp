#pragma once
// The trainer's pipeline path (parallel.pipeline > 1): a DP x PP grid, one
// PipelineModel per rank, the same loader, schedule, reporter, evaluation and
// checkpoints as the data-parallel path (trainer.cpp), which stays untouched.
//
// Data: every stage of a replica opens the loader over the data-parallel group,
// so all stages of a replica see the same batches; the first uses the images,
// the last the labels. Checkpoints are the data-parallel path's (one logic,
// checkpoint_session.hpp): the whole model per parameter ("param/<name>",
// "buffer/<name>", "optim/<slot>/<name>"), gathered on world rank 0 from every
// stage (DP rank 0, tensor shards whole); on load every rank receives the file
// and takes the names it owns, so a checkpoint resumes at any layout.
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
  bool load(const std::string& path, bool with_optimizer);  // false: --resume auto found nothing
  std::string save_checkpoint();
  const std::string& run_id() const;
  const LoadedCheckpoint& loaded() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringtrain
