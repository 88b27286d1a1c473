#pragma once
// Trainer::Impl, shared by trainer.cpp (building, the step, the epoch,
// evaluation), trainer_grid.cpp (the step and state of a rank's part of the
// grid: parallel.pipeline or parallel.tensor > 1) and trainer_checkpoint.cpp
// (checkpoints, resume, stopping).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/data/loader.hpp"
#include "ringtrain/engine/engine.hpp"
#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/optim/loss_scale.hpp"
#include "ringtrain/optim/optimizer.hpp"
#include "ringtrain/optim/schedule.hpp"
#include "ringtrain/optim/sharded_optimizer.hpp"
#include "ringtrain/parallel/grid_model.hpp"
#include "ringtrain/train/device_runtime.hpp"
#include "ringtrain/train/state.hpp"
#include "ringtrain/train/trainer.hpp"
#include "checkpoint_session.hpp"

namespace ringtrain {

struct Trainer::Impl {
  using Clock = std::chrono::steady_clock;
  TrainConfig cfg;
  Communicator world;
  TrainerHooks hooks;
  Device device;
  DeviceRuntime* rt = nullptr;  // the device's optimizer, fusion ops and gradient operations
  MathMode math = MathMode::fp32;
  std::unique_ptr<LossScaler> scaler;  // train.precision = fp16 only
  Tensor scaler_state;                 // f64 [4] on the host: checkpointed and broadcast
  std::unique_ptr<data::Loader> loader;
  // parallel.pipeline or parallel.tensor > 1: this rank's stage and tensor shard
  // (trainer_grid.cpp); the members below up to `engine` stay empty then.
  // Otherwise the whole model is replicated on every rank (data parallelism).
  std::unique_ptr<ProcessGrid> grid;
  std::unique_ptr<GridModel> gm;
  std::string layout;            // "parallel.pipeline = 2 with parallel.tensor = 2", for messages
  std::int64_t num_params = 0;   // the whole model's
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;  // null with parallel.shard_optimizer: `zero` updates instead
  // parallel.shard_optimizer (ZeRO-1): each rank holds its slice of the state;
  // `whole` is the state gathered onto rank 0 while a checkpoint is saved or loaded.
  std::unique_ptr<ShardedOptimizer> zero;
  std::unique_ptr<Optimizer> whole;
  Optimizer* state_optimizer() const { return zero ? whole.get() : optimizer.get(); }
  std::unique_ptr<LrSchedule> schedule;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Reporter> reporter;
  // [2] f32 on the host, averaged beside the gradients: the step's loss, and
  // the stop flag (> 0 when a signal reached any rank: every rank sees it at
  // the same step, for free).
  Tensor loss_buf;
  bool save_due = false;  // the last step asked for a checkpoint (checkpoint.every_steps / every_s)
  bool save_asked = false;  // a rank's checkpoint.every_s clock asked in the last step's all-reduce
  Tensor dlogits;               // reused across steps
  std::vector<Handle> handles;  // this step's outstanding all-reduces
  // comm.deterministic: static buckets of consecutive parameters, in backward order.
  struct Bucket {
    Tensor grads;                // flat view of the arena's gradients
    std::size_t params = 0;      // parameters in it
    std::size_t pending = 0;     // not yet ready this step
  };
  std::vector<Bucket> buckets;
  std::vector<int> bucket_of;    // parameter index -> bucket
  // Dropout layers draw masks from (seed, call count): the counts are run state
  // too ("rng/<layer>.calls", i64 [1] host tensors), or a resumed run would
  // repeat the masks of its first steps.
  std::vector<std::pair<Dropout*, Tensor>> dropout_calls;
  RunPosition pos;               // where the run stands (checkpointed)
  CheckpointSession ckpt{cfg, world, hooks, pos};  // checkpoints and resume (checkpoint_session.hpp)
  int stop_signal = 0;           // set when the ranks agreed to stop on a signal (-1: it reached another rank)
  std::string last_checkpoint;   // path of the last checkpoint written (rank 0)

  // Per-epoch counters of this rank.
  struct EpochStats {
    double loss_sum = 0, compute_s = 0, comm_s = 0, pipeline_wait_s = 0;
    std::int64_t steps = 0, correct = 0, seen = 0, skipped = 0;
  };

  Impl(TrainConfig c, Communicator w, TrainerHooks h);

  // trainer_grid.cpp
  void build_grid();
  double grid_step(EpochStats& st);
  std::pair<double, std::int64_t> grid_eval_batch(const data::Batch& b);  // {loss sum, samples counted here}
  void save_grid_checkpoint(bool force);
  bool load_grid(const std::string& path, bool with_optimizer);
  void verify_grid_replicas();

  // trainer.cpp
  const Communicator& dp() const { return grid ? grid->dp() : world; }  // ranks sharing this rank's part
  void open_loader();
  void build_model();
  void build_optimizer();
  void build_sharded_optimizer(const OptimizerConfig& oc);  // zero.cpp
  bool apply_update(double lr);  // zero.cpp: reduce, unscale, clip, step; false: step skipped (fp16)
  void build_engine();
  void make_buckets();
  void on_grads_ready(std::span<const std::size_t> params);
  NamedTensorList run_state();   // model_state + the loss scaler: what a checkpoint holds
  void broadcast_state();
  std::int64_t global_batch() const;
  std::int64_t steps_per_epoch() const;
  std::int64_t total_steps() const;
  double train_step(EpochStats& st);
  EvalResult evaluate(const std::string& path);
  TrainResult fit();
  EpochMetrics train_epoch(int epoch, bool& finished);
  void verify_identical_state();
  void start_reporting();

  // trainer_checkpoint.cpp
  void save_checkpoint(bool force);
  bool load(const std::string& path, bool with_optimizer);  // false: --resume auto found nothing
};

}  // namespace ringtrain
