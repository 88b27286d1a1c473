#pragma once
// Trainer::Impl, shared by trainer.cpp (building, the step, the epoch,
// evaluation) and trainer_checkpoint.cpp (checkpoints, resume, stopping).
// One implementation for every layout: the rank's part of the model is a set
// of parts (parallel/parts.hpp); data parallelism is the grid with one stage
// and one tensor shard.
#include "ringtrain/core/trace.hpp"
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/data/loader.hpp"
#include "ringtrain/optim/schedule.hpp"
#include "ringtrain/parallel/device_runtime.hpp"
#include "ringtrain/parallel/parts.hpp"
#include "ringtrain/train/state.hpp"
#include "ringtrain/train/straggler.hpp"
#include "ringtrain/train/trainer.hpp"
#include "checkpoint/session.hpp"
#include "checkpoint/snapshot.hpp"

namespace ringtrain {

struct Trainer::Impl {
  using Clock = std::chrono::steady_clock;
  TrainConfig cfg;
  Communicator world;
  TrainerHooks hooks;
  Device device;
  DeviceRuntime* rt = nullptr;    // the device's optimizer, fusion ops and gradient operations
  std::unique_ptr<ProcessGrid> grid;
  std::string layout;             // "parallel.pipeline = 2 with parallel.tensor = 2" ("" for data parallelism)
  std::unique_ptr<data::Loader> loader;  // over the data-parallel group: a replica's stages read the same batches
  ModelParts parts;               // this rank's stage and shard, and what trains them
  std::int64_t num_params = 0;    // the whole model's
  // Language models: model FLOPs per sample (3 x the forward's matmuls, attention
  // included) and the measured matmul peak summed over the ranks (MFU); 0: not reported.
  double flops_per_sample = 0, matmul_peak = 0;
  // The pipeline link (ScheduleExecutor::measure_link), measured at the first
  // epoch's prediction; latency < 0: not yet.
  LinkCost pipeline_link{-1, 0};
  ScheduleKind schedule_kind = ScheduleKind::one_f_one_b;  // the pipeline's, auto resolved
  // parallel.replan_steps (once per process): 0 = alternating the unit-cost
  // table and every backward whole, 1 = the rebuilt table and the faster of
  // those, 2 = done.
  int replan_phase = 0;
  struct Timed {
    Schedule table;  // lowered
    std::string what;
    std::vector<double> step_s;     // its steps' schedule times
    std::vector<ChunkTime> chunks;  // per chunk: summed per-step mean costs
  };
  std::vector<Timed> replan_tables;  // the tables this phase alternates
  std::size_t replan_turn = 0;       // steps of this phase so far
  std::unique_ptr<LrSchedule> schedule;
  std::unique_ptr<Reporter> reporter;
  RunPosition pos;                // where the run stands (checkpointed)
  CheckpointSession ckpt{cfg, world, hooks, pos};  // checkpoints and resume (checkpoint_session.hpp)
  int stop_signal = 0;            // set when the ranks agreed to stop on a signal (-1: it reached another rank)
  bool save_due = false;          // the last step asked for a checkpoint (checkpoint.every_steps / every_s)
  std::string last_checkpoint;    // path of the last checkpoint written (rank 0)
  std::vector<double> checkpoint_stalls_s;  // how long each save_checkpoint paused training
  std::vector<double> memory_stalls_s;      // how long each memory snapshot paused training
  std::int64_t saved_at_step = -1; // the step of this process's last checkpoint
  NamedTensorList whole_views;    // local_views(): gather_whole_state's views, listed once
  Snapshot snapshot{[this] { return parts.state->replicated(); }};  // checkpoint.async: copies of the live state
  Snapshot memory_snapshot_copy{[this] { return parts.state->replicated(); }};  // checkpoint.memory_every_steps
  std::int64_t memory_saved_at = -1;  // the step of the last memory snapshot
  Tensor scaler_state;            // f64 [4] on the host: the fp16 loss scale, checkpointed
  std::unique_ptr<StragglerMonitor> stragglers;  // made in train_epoch's first call
  trace::Window trace_window;     // log.trace_steps

  // Per-epoch counters: the job's statistics, this rank's times.
  struct EpochStats {
    double loss_sum = 0, compute_s = 0, comm_s = 0, pipeline_wait_s = 0;
    std::int64_t steps = 0, correct = 0, seen = 0, skipped = 0;
    // Pipeline: the schedule's time and each chunk's per-micro-batch costs,
    // summed over the steps timed (not the run's first: it allocates).
    double schedule_s = 0;
    std::int64_t timed = 0;
    std::vector<ChunkTime> chunks;
    // Each timed step's chunk costs (the last kStepsKept steps): the prediction from per-step costs.
    static constexpr std::size_t kStepsKept = 1024;
    std::vector<std::vector<ChunkTime>> step_chunks;
    std::vector<double> step_s;  // the same steps' schedule times (this rank's)
  };

  Impl(TrainConfig c, Communicator w, TrainerHooks h);

  // trainer.cpp (the pipeline schedule's planning: trainer_pipeline.cpp)
  const Communicator& dp() const { return grid->dp(); }  // ranks holding the same part of the model
  void open_loader();
  void build_model();
  void init_from_file();  // model.init_from: each rank reads the parameters it holds
  std::int64_t global_batch() const;
  std::int64_t steps_per_epoch() const;
  std::int64_t total_steps() const;
  double train_step(EpochStats& st);
  // Pipeline: the schedule's mean measured time and the simulator's prediction
  // from the same steps' per-chunk costs (collective).
  void predict_schedule(const EpochStats& st, EpochMetrics& m);
  void choose_schedule(const ModelConfig& mc, GridConfig& pc);  // parallel.schedule = auto
  // parallel.replan_steps, after each timed step (collective over the world)
  void replan_step(EpochStats& st, double schedule_s, const std::vector<ChunkTime>& chunks);
  EvalResult evaluate(const std::string& path);
  TrainResult fit();
  EpochMetrics train_epoch(int epoch, bool& finished);
  std::vector<MoeEpochStats> moe_epoch_stats();  // model.experts > 0: per MoE layer, every rank's forwards
  void verify_replicas();
  void start_reporting();
  void finish_trace();  // collective: the trace of log.trace_steps to its file

  // trainer_checkpoint.cpp
  NamedTensorList extra_state();  // beside the model: the loss scale
  bool local_views() const;                          // the whole state is this rank's fixed views
  NamedTensorList whole_for_checkpoint();            // collective; the whole state on rank 0
  std::vector<StatePiece> pieces_for_checkpoint();   // this rank's share (checkpoint.parallel)
  void prepare_snapshot();                           // the first snapshot's blocks, at the start
  void save_checkpoint(bool force);
  void memory_snapshot();  // checkpoint.memory_every_steps, when due after this step
  bool load(const std::string& path, bool with_optimizer);  // false: --resume auto found nothing
};

}  // namespace ringtrain
