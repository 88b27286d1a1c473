#pragma once
// GridModel: one rank's part of a model trained on a DP x PP x TP grid, for
// every layout — data parallelism is the grid with one stage holding every
// layer and one tensor shard. It owns the rank's Stage (its layers only, each
// split over the tensor group), the executor running the pipeline schedule
// (one stage: F, B, W per micro-batch), a fusion Engine on the data-parallel
// group that averages each layer's gradients as soon as its last micro-batch
// gradient exists (overlapping the backward), and the one update path
// (grid_update.cpp): fp16 unscale and skip, global-norm clipping, ZeRO-1, the
// optimizer step through the device runtime.
//
//   GridModel gm(grid, model_cfg, grid_cfg, optim_cfg, device, runtime);
//   GridStepResult r = gm.train_step(images, labels, step, lr);  // collective over the world
//
// Rules:
//  - A step takes `accumulation` loader batches of B = GridConfig::batch
//    samples each (this replica's); each is cut into m = micro_batches
//    micro-batches, so the schedule runs accumulation·m micro-batches. The
//    first stage reads the images, the last the labels (other stages may pass
//    undefined tensors).
//  - The loss is the mean over the step's samples (each micro-batch's gradient
//    is scaled by 1/(accumulation·m)), so a step equals the unsplit step on the
//    same global batch up to float summation order.
//  - Dropout: the stage tells its layers the step and each micro-batch's first
//    sample in the step's global batch, so masks follow the 1-rank run at any
//    layout and resume needs no state (layer.hpp SamplePosition).
//  - BatchNorm (m > 1): each micro-batch is normalised with its own statistics
//    (as GPipe); the running statistics are updated once per step with the
//    statistics of all of the step's micro-batches (torchgpipe's
//    DeferredBatchNorm), not once per micro-batch.
//  - The step's loss, stop flag and checkpoint request are one small
//    all-reduce: fused with the gradients in the engine when the grid is pure
//    data parallelism, one world all-reduce otherwise.
//  - Devices: layers run on `dev`; stage activations are staged through host
//    memory for MPI, tensor-parallel all-reduces use the device collectives.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/engine/engine.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/optim/loss_scale.hpp"
#include "ringtrain/optim/optimizer.hpp"
#include "ringtrain/optim/sharded_optimizer.hpp"
#include "ringtrain/parallel/device_runtime.hpp"
#include "ringtrain/parallel/executor.hpp"
#include "ringtrain/parallel/grid.hpp"
#include "ringtrain/parallel/partition.hpp"
#include "ringtrain/parallel/stage.hpp"

namespace ringtrain {

struct GridConfig {
  int micro_batches = 1;        // per loader batch (parallel.micro_batches); m must divide `batch`
  int accumulation = 1;         // loader batches per optimizer step (train.accumulation)
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  PartitionKind partition = PartitionKind::uniform;
  std::vector<int> balance;     // partition = list
  std::int64_t batch = 0;       // samples per loader batch on this replica (data.batch_size)
  EngineOptions engine;         // for the data-parallel gradient averages (device_ops filled here)
  // comm.deterministic: static buckets — consecutive layers' gradients, one
  // span of the arena, closed once they hold bucket_bytes (walking from the
  // last layer, the first ready in backward) — go to the engine, which does not
  // fuse (fusion by readiness changes which ring chunk, hence which summation
  // order, an element gets at DP >= 3): bitwise-reproducible runs.
  bool deterministic = false;
  std::int64_t bucket_bytes = 1 << 20;  // comm.bucket_bytes
  double clip_norm = 0;         // > 0: clip to this global norm over the whole model
  double timeout_s = 300;       // a stage receive waiting longer ends the job (0 = never)
  bool loss_scaling = false;    // train.precision = fp16: dynamic loss scaling (optim/loss_scale.hpp)
  bool shard_optimizer = false; // ZeRO-1 over the data-parallel group
  CollectiveOptions zero_collectives;  // its reduce-scatter / all-gather
  bool skip_allreduce = false;  // benchmarks: compute alone, gradients not averaged
};

// What each rank tells every other in the step's loss all-reduce.
struct StepFlags {
  bool stop = false;              // a stop signal is pending on this rank
  bool save = false;              // a checkpoint is due by this rank's clock
  bool checkpoint_ready = true;   // this rank's part of a checkpoint in flight is durable
};

struct GridStepResult {
  double loss = 0;              // mean over the global batch (every rank gets it)
  // This rank's share of the step's counts: the samples its logits saw (last
  // stage, tensor rank 0; zero elsewhere), so sums over the world are global.
  std::int64_t correct = 0, seen = 0;
  bool stop = false;            // some rank passed stop = true to this step
  bool save = false;            // some rank passed save = true to this step
  bool checkpoint_ready = true; // every rank passed checkpoint_ready = true
  bool skipped = false;         // fp16: a non-finite gradient somewhere, no update (every rank alike)
  StepTiming timing;            // this rank's
};

// Bytes this rank holds, by kind (benchmarks and the start-up line).
struct GridMemory {
  std::size_t params = 0, grads = 0, optimizer = 0;
  std::int64_t param_count = 0;  // elements of this rank's parameters
};

class GridModel final : private StageOps {
 public:
  // rt: the device kind's runtime (null: the registered one for dev).
  GridModel(const ProcessGrid& grid, const ModelConfig& mc, const GridConfig& pc, const OptimizerConfig& oc,
            Device dev = Device::cpu(), DeviceRuntime* rt = nullptr);
  ~GridModel() override;

  // One optimizer step over `accumulation` loader batches (images[i],
  // labels[i]: this replica's batch i, B samples). `step` is the run's
  // optimizer step (Dropout masks). `flags` ride in the step's loss
  // all-reduce: every rank learns them without another one.
  GridStepResult train_step(const std::vector<Tensor>& images, const std::vector<Tensor>& labels, std::int64_t step,
                            double lr, StepFlags flags = {});
  // Forward only, in eval mode, over the pipeline group; returns {loss sum,
  // correct} over the first `valid` samples on the last stage's tensor rank 0,
  // zeros elsewhere. Every transfer is bounded by the stage timeout.
  // One loader batch per step (tests and benchmarks: train.accumulation = 1).
  GridStepResult train_step(const Tensor& images, const Tensor& labels, double lr, std::int64_t step = 0) {
    return train_step(std::vector<Tensor>{images}, std::vector<Tensor>{labels}, step, lr);
  }
  std::pair<double, std::int64_t> eval_batch(const Tensor& images, const Tensor& labels, std::int64_t valid);

  const ProcessGrid& grid() const { return grid_; }
  Stage& stage() { return *stage_; }
  Device device() const { return dev_; }
  const Engine* engine() const { return engine_.get(); }  // null without data parallelism
  const std::vector<int>& balance() const { return balance_; }  // layers per stage
  LossScaler* scaler() { return scaler_.get(); }  // fp16 only
  const ShardedOptimizer* zero() const { return zero_.get(); }
  GridMemory memory() const;

  // This stage's part of the model state, per parameter (checkpoint layout of
  // train/state.hpp): "param/<name>", "buffer/<name>", "optim/<slot>/<name>",
  // "optim/step". With ZeRO-1 the optimizer names are there only while a
  // whole copy exists (gather_whole_state / restore_whole_state make one).
  std::vector<std::pair<std::string, Tensor>> named_state();
  // The state every data-parallel replica must hold bit for bit (flat buffers:
  // few large messages), for train.verify_every.
  std::vector<std::pair<std::string, Tensor>> replicated_state();
  // The whole model's state on world rank `root`, tensor-parallel shards
  // gathered whole (every stage's, from data-parallel rank 0, in stage order;
  // "optim/step", held by every stage alike, once); empty elsewhere.
  // Collective over the world.
  std::vector<std::pair<std::string, Tensor>> gather_whole_state(int root = 0);
  // This rank's share of the whole model's state for a checkpoint written by
  // every rank (no communication): its tensor shards and ZeRO-1 slices, and
  // for what several ranks hold alike (replicas, tensor-replicated tensors)
  // an equal byte range of the concatenation, so the writes balance. Views of
  // live memory. The pieces of every rank cover each whole tensor of
  // gather_whole_state exactly once.
  std::vector<StatePiece> state_pieces();
  // The names this rank restores, with their WHOLE dtype and shape (host
  // tensors whose contents are not meaningful): what a checkpoint must hold.
  std::vector<std::pair<std::string, Tensor>> whole_names(bool with_optimizer);
  // Hands each name's WHOLE tensor (dtype and shape as saved) to `fill`, which
  // returns false to leave it as it is, and keeps this rank's part (its stage,
  // shard and ZeRO slice). Collective over the data-parallel group (ZeRO-1).
  void restore_whole_state(const std::function<bool(const std::string&, Tensor& whole)>& fill, bool with_optimizer);
  // Every replica takes data-parallel rank 0's parameters, buffers, optimizer
  // state and loss scale (the start of a run: one source of truth).
  void broadcast_state();

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
  std::vector<std::pair<std::string, Tensor>> whole_state();  // this stage, shards whole (grid_model_state.cpp)
  // grid_update.cpp: the one update path; false = step skipped (fp16).
  bool update(double lr);
  std::vector<char> counted_once(const ParamArena& a, const std::vector<std::size_t>* full_index) const;

  const ProcessGrid& grid_;
  GridConfig pc_;
  Device dev_;
  DeviceRuntime& rt_;  // declared after dev_: initialised from it
  int steps_m_ = 1;                  // micro-batches per step: accumulation · m
  std::int64_t mb_size_ = 0;
  std::vector<int> balance_;
  std::unique_ptr<Stage> stage_;
  std::unique_ptr<Optimizer> opt_;   // null with ZeRO-1
  std::unique_ptr<ShardedOptimizer> zero_;
  std::unique_ptr<Optimizer> whole_opt_;  // ZeRO-1: the gathered state while a checkpoint is written or read
  std::unique_ptr<LossScaler> scaler_;
  Communicator owners_;              // ranks that together hold each gradient once (update's sums)
  std::unique_ptr<ScheduleExecutor> exec_;
  std::unique_ptr<Engine> engine_;   // dp > 1 only
  std::vector<Handle> handles_;
  // comm.deterministic: buckets of consecutive layers, and each layer's bucket (-1: per parameter).
  struct Bucket {
    Tensor grads;            // a span of the arena's gradients
    int layers = 0, pending = 0;
    std::string name;
  };
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_layer_;
  std::vector<Tensor> dlogits_;      // per slot (kept by the last layer for its W)
  Tensor step_vec_;                  // f32 [4] host: loss, stop, save, checkpoint ready (averaged)
  std::vector<Tensor> images_, labels_;
  std::int64_t step_ = 0;
  double lr_ = 0, loss_sum_ = 0;
  std::int64_t correct_ = 0, seen_ = 0;
  bool skipped_ = false;
};

}  // namespace ringtrain
