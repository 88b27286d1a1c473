#pragma once
// The parts one rank trains with on a DP x PP x TP grid, for every layout
// (data parallelism is the grid with one stage holding every layer and one
// tensor shard), and the training step that composes them:
//
//   Stage             the rank's model chunks (top-level layer ranges), split over its tensor group
//   Loss              what the last stage's output is trained on (the model's: nn/model_registry.hpp)
//   ScheduleExecutor  the pipeline schedule over the stage's micro-batches
//   GradSync          none | fusion-engine all-reduce | ZeRO-1/2 reduce-scatter |
//                     ZeRO-3 (also gathers each layer bucket's parameters before use)
//   Updater           fp16 unscale/skip, global-norm clipping, the optimizer step
//   ModelState        the state under checkpoint names (save, resume, broadcast)
//
//   ModelParts parts = build_parts(grid, model_cfg, grid_cfg, optim_cfg, device);
//   StepResult r = train_step(parts, StepInput{images, labels, step, lr}, flags);
//
// A rank builds only its own stage and shard: nothing of the whole model is
// allocated. Building is collective over the world; so is every step.
#include <memory>
#include <vector>

#include "ringtrain/engine/engine.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/optim/optimizer.hpp"
#include "ringtrain/parallel/device_runtime.hpp"
#include "ringtrain/parallel/executor.hpp"
#include "ringtrain/parallel/grad_sync.hpp"
#include "ringtrain/parallel/grid.hpp"
#include "ringtrain/parallel/model_state.hpp"
#include "ringtrain/parallel/partition.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "ringtrain/parallel/step.hpp"
#include "ringtrain/parallel/updater.hpp"

namespace ringtrain {

struct GridConfig {
  int micro_batches = 1;        // per loader batch (parallel.micro_batches); m must divide `batch`
  int accumulation = 1;         // loader batches per optimizer step (train.accumulation)
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  std::string schedule_file;    // schedule = file: the table (parallel.schedule = FILE.csv)
  int virtual_stages = 2;       // schedule = interleaved: chunks per rank (parallel.virtual_stages)
  PartitionKind partition = PartitionKind::uniform;
  std::vector<int> balance;     // partition = list
  std::int64_t batch = 0;       // samples per loader batch on this replica (data.batch_size)
  EngineOptions engine;         // for the data-parallel gradient averages (device_ops filled here)
  // comm.deterministic: fixed buckets of consecutive layers' gradients
  // (bucket_bytes each), so every run sums every element in the same order.
  bool deterministic = false;
  std::int64_t bucket_bytes = 1 << 20;  // comm.bucket_bytes (also ZeRO-2's buckets)
  UpdateConfig update;          // clipping, fp16 loss scaling, ZeRO (update.zero)
  bool zero_release = true;     // ZeRO-2: give reduced buckets' gradient pages back (parallel.zero_release)
  bool skip_allreduce = false;  // benchmarks: compute alone, gradients not averaged
  Recompute recompute = Recompute::none;  // train.recompute (stage.hpp)
};

struct ModelParts {
  std::vector<int> balance;  // layers per stage (every model chunk of the pipeline, in model order)
  std::unique_ptr<Stage> stage;
  LossPtr loss;
  std::unique_ptr<ScheduleExecutor> executor;
  std::unique_ptr<Updater> updater;
  std::unique_ptr<GradSync> grad_sync;
  std::unique_ptr<ModelState> state;
  // MoE layers' shared state (aux gradient scale, metrics); null without experts.
  std::shared_ptr<MoeShared> moe;
  int per_step = 1;  // micro-batches per optimizer step (the loss's 1/m)
};

// rt: the device kind's runtime (null: the registered one for dev).
ModelParts build_parts(const ProcessGrid& grid, const ModelConfig& mc, const GridConfig& gc,
                       const OptimizerConfig& oc, Device dev = Device::cpu(), DeviceRuntime* rt = nullptr);

// What this rank tells every other rank at the end of a step (StepStats' flags).
struct StepFlags {
  bool stop = false;              // a stop signal is pending on this rank
  bool save = false;              // a checkpoint is due by this rank's clock
  bool checkpoint_ready = true;   // this rank's part of a checkpoint in flight is durable
};

struct StepResult {
  StepStats stats;    // the job's sums (every rank alike)
  StepTiming timing;  // this rank's
  double loss() const { return stats.mean_loss(); }
  bool stop() const { return stats.stop > 0; }
  bool save() const { return stats.save > 0; }
  bool checkpoint_ready() const { return stats.parts_pending == 0; }
};

// One optimizer step on every layout. Collective over the world.
StepResult train_step(const ProcessGrid& grid, ModelParts& parts, const StepInput& in, StepFlags flags = {});
// One loader batch per step (tests and benchmarks: train.accumulation = 1).
StepResult train_step(const ProcessGrid& grid, ModelParts& parts, const Tensor& images, const Tensor& labels,
                      double lr, std::int64_t step = 0);

// Bytes this rank holds, by kind (benchmarks and the start-up line). ZeRO-2:
// `grads` is the rank's slice, and grads_in_flight the most of the full
// gradient buffer resident at once (GradSync::grad_bytes_in_flight). ZeRO-3:
// `params` is the rank's slice too, and params_in_flight the most of the
// gathered parameters resident at once (GradSync::param_bytes_in_flight).
struct GridMemory {
  std::size_t params = 0, grads = 0, optimizer = 0, grads_in_flight = 0, params_in_flight = 0;
  std::int64_t param_count = 0;  // elements of this rank's parameters
};
GridMemory memory(const ModelParts& parts);

}  // namespace ringtrain
