#pragma once
// GridModel: one rank's part of a model trained on a DP x PP x TP grid — its
// Stage (its layers only, each split over the tensor group), the optimizer
// over the stage's arena, the executor running the pipeline schedule (one
// stage: forward, backward), and a fusion Engine on the data-parallel group
// that averages the stage's gradients, each layer's as soon as its last
// micro-batch gradient exists. The Trainer runs it when parallel.pipeline or
// parallel.tensor is above 1.
//
//   GridModel gm(grid, model_cfg, grid_cfg, optim_cfg);
//   GridStepResult r = gm.train_step(images, labels, lr);   // collective over the world
//
// Rules:
//  - images/labels are this data-parallel replica's batch (B samples, m | B):
//    the first stage reads the images, the last the labels (other stages may
//    pass undefined tensors). Micro-batch i is samples [i·B/m, (i+1)·B/m).
//  - The loss is the mean over the batch (each micro-batch's gradient is
//    scaled by 1/m), so a step equals the unpipelined step on the same batch
//    up to float summation order. The result's loss/accuracy are global over
//    the world (every rank gets them).
//  - BatchNorm (m > 1): each micro-batch is normalised with its own statistics
//    (as GPipe); the running statistics are updated once per step with the mean
//    and unbiased variance of the layer's inputs over all m micro-batches
//    (deferred, torchgpipe's DeferredBatchNorm), not m times.
//  - CPU only for now (the stage transfers read host memory): another device
//    is an Error naming train.device.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/engine/engine.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/optim/optimizer.hpp"
#include "ringtrain/parallel/executor.hpp"
#include "ringtrain/parallel/grid.hpp"
#include "ringtrain/parallel/partition.hpp"
#include "ringtrain/parallel/stage.hpp"

namespace ringtrain {

struct GridConfig {
  int micro_batches = 1;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  PartitionKind partition = PartitionKind::uniform;
  std::vector<int> balance;     // partition = list
  std::int64_t batch = 0;       // samples per replica per step (m must divide it)
  EngineOptions engine;         // for the data-parallel gradient averages
  // comm.deterministic: each layer's gradients go to the engine as ONE static
  // bucket (a span of the arena) and the engine does not fuse (fusion by
  // readiness changes which ring chunk, hence which summation order, an element
  // gets at DP >= 3): bitwise-reproducible runs.
  bool deterministic = false;
  double clip_norm = 0;         // > 0: clip to this global norm over all stages and tensor shards
  double timeout_s = 300;       // a stage receive waiting longer ends the job (0 = never)
};

struct GridStepResult {
  double loss = 0;              // mean over the global batch
  std::int64_t correct = 0, seen = 0;  // over the global batch
  bool stop = false;            // some rank passed stop = true to this step
  bool save = false;            // some rank passed save = true to this step
  StepTiming timing;            // this rank's
};

class GridModel final : private PipeOps {
 public:
  GridModel(const ProcessGrid& grid, const ModelConfig& mc, const GridConfig& pc, const OptimizerConfig& oc,
                Device dev = Device::cpu());
  ~GridModel() override;

  // `stop` (a pending stop signal on this rank) and `save` (a checkpoint due
  // by this rank's clock) ride in the step's one all-reduce of loss and
  // accuracy: every rank learns them without a second one.
  GridStepResult train_step(const Tensor& images, const Tensor& labels, double lr, bool stop = false,
                            bool save = false);
  // Forward only, in eval mode, over the pipeline group; returns {loss sum,
  // correct} over the first `valid` samples on the last stage, zeros elsewhere.
  std::pair<double, std::int64_t> eval_batch(const Tensor& images, const Tensor& labels, std::int64_t valid);

  const ProcessGrid& grid() const { return grid_; }
  Stage& stage() { return *stage_; }
  Optimizer& optimizer() { return *opt_; }
  const Engine* engine() const { return engine_.get(); }  // null without data parallelism
  const std::vector<int>& balance() const { return balance_; }  // layers per stage
  // This stage's part of the model state, per parameter (checkpoint layout of
  // train/state.hpp): "param/<name>", "buffer/<name>", "optim/<slot>/<name>", "optim/step".
  std::vector<std::pair<std::string, Tensor>> named_state();
  // The same names with tensor-parallel shards gathered WHOLE (collective over
  // grid.tp(); src/parallel/tensor_state.cpp), so a checkpoint does not depend on
  // parallel.tensor; restore_whole_state hands each whole tensor to `fill` and
  // keeps this rank's part (no communication). fill returns false to leave a name as it is.
  std::vector<std::pair<std::string, Tensor>> whole_state();
  // The whole model's state on world rank `root` (every stage's whole_state,
  // from data-parallel rank 0, in stage order; "optim/step", held by every
  // stage alike, once); empty elsewhere. Collective over the world.
  std::vector<std::pair<std::string, Tensor>> gather_whole_state(int root = 0);
  // Global-norm clipping (clip_grad_norm semantics) over the whole model: shard
  // norms summed over the tensor and pipeline groups, replicated parameters once.
  double clip_grads(double max_norm);
  void restore_whole_state(const std::function<bool(const std::string&, Tensor& whole)>& fill);

 private:
  Tensor load(int mb) override;
  Tensor forward(int slot, int mb, const Tensor& x) override;
  Tensor loss_grad(int slot, int mb, const Tensor& out) override;
  Tensor backward_input(int slot, int mb, const Tensor& dy, bool last_mb) override;
  void backward_weight(int slot, int mb, bool last_mb) override;
  void reduce_grads() override;
  void optimizer_step() override;
  void submit(int local_layer);
  void make_layer_buckets();

  const ProcessGrid& grid_;
  GridConfig pc_;
  std::int64_t mb_size_ = 0;
  std::vector<int> balance_;
  std::unique_ptr<Stage> stage_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<PipelineExecutor> exec_;
  std::unique_ptr<Engine> engine_;  // dp > 1 only
  std::vector<Handle> handles_;
  std::vector<Tensor> layer_bucket_;  // deterministic: per local layer, its gradients' span (undefined: none)
  std::vector<Tensor> dlogits_;     // per slot (kept by the last layer for its W)
  Tensor images_, labels_;
  double lr_ = 0, loss_sum_ = 0;
  std::int64_t correct_ = 0;
};

}  // namespace ringtrain
