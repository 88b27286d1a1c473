#pragma once
// ScheduleExecutor: interprets this rank's list of a lowered schedule table
// (schedule.hpp) for one optimizer step over the grid's pipeline
// communicator, on the rank's model chunks. Every layout runs it: a single
// stage (data or tensor parallelism) is the table F, B per micro-batch. It
// takes the step's inputs as a value and returns its counts and timing;
// nothing of a step outlives run().
//
//   StepOutput out = executor.run(stage, loss, StepInput{images, labels, step, lr, scale}, grad_sync);
//
// Rules:
//  - The loss is an argument (nn/loss.hpp): the last stage applies it to its
//    output; the executor knows no model type. A collective loss (split
//    logits) runs on every tensor rank of the last stage, any other on all of
//    them too but is counted by tensor rank 0 alone.
//  - A step takes `accumulation` loader batches of B samples each; each is cut
//    into m = micro_batches micro-batches, so the schedule runs
//    accumulation·m micro-batches. The loss is the mean over the step's
//    samples: each micro-batch's loss gradient is scaled by
//    loss_scale/(accumulation·m), so a step equals the unsplit step on the
//    same global batch up to float summation order.
//  - Dropout: the stage learns the step and each micro-batch's first sample
//    in the step's global batch, so masks follow the 1-rank run at any layout.
//  - BatchNorm (more than one micro-batch): each micro-batch is normalised
//    with its own statistics, the running statistics are updated once at the
//    step's end with all of its micro-batches' (stage.hpp).
//  - Gradients: each chunk's last backward of the step tells grad_sync each
//    layer whose step gradient is complete (layer_ready), so synchronisation
//    overlaps the rest of the backward.
//  - Transfers: activation/gradient shapes are known ahead (from the model),
//    so receive buffers (one per chunk, micro-batch and direction, where the
//    neighbouring chunk is on another rank) are allocated once and every
//    receive of a step is posted when the step starts; sends are
//    non-blocking from the slot's own output, completed before that slot is
//    reused and at the end of the step. A list can therefore only wait in
//    RecvAct/RecvGrad, and validate() proved at construction that it cannot
//    deadlock. Consecutive chunks on one rank (the V layout) hand over in memory.
//  - Construction is collective over the world: the table is validated (the
//    same on every rank), and neighbours exchange the shape they will send /
//    expect; a mismatch is an Error on every rank naming both stages and shapes.
//  - Every wait (receive, send, evaluation) is bounded by the pipeline
//    communicator's timeout; past it the job ends naming the stage and world
//    rank that never answered (peer.hpp).
//  - Devices: transfers go through host memory. A stage on a GPU sends a host
//    copy of its output (kept until the send completes) and moves what it
//    receives to its device before use.
#include <cstdint>
#include <utility>
#include <vector>

#include "ringtrain/core/tensor.hpp"
#include "ringtrain/parallel/device_runtime.hpp"
#include "ringtrain/parallel/grad_sync.hpp"
#include "ringtrain/parallel/grid.hpp"
#include "ringtrain/parallel/schedule.hpp"
#include "ringtrain/parallel/simulator.hpp"
#include "ringtrain/parallel/step.hpp"

namespace ringtrain {

class Loss;
class Stage;

// How a step is cut into micro-batches.
struct MicroBatching {
  int micro_batches = 1;    // per loader batch (parallel.micro_batches)
  int accumulation = 1;     // loader batches per step (train.accumulation)
  std::int64_t batch = 0;   // samples per loader batch on this replica (data.batch_size)
  int per_step() const { return micro_batches * accumulation; }
  std::int64_t size() const { return batch / micro_batches; }
};

class ScheduleExecutor {
 public:
  // Shapes of one micro-batch at the input and output of each of the rank's
  // chunks (chunk order); `table` is the step's compute table for
  // grid.pipeline_layout() and mb.per_step() micro-batches.
  ScheduleExecutor(const ProcessGrid& grid, const Schedule& table, MicroBatching mb,
                   std::vector<std::pair<Shape, Shape>> chunk_shapes, Device dev, DeviceRuntime& rt);
  // One chunk per rank, the table of a built-in kind (tests and benchmarks).
  ScheduleExecutor(const ProcessGrid& grid, ScheduleKind kind, MicroBatching mb, Shape in_mb, Shape out_mb,
                   Device dev, DeviceRuntime& rt);
  ~ScheduleExecutor();
  ScheduleExecutor(const ScheduleExecutor&) = delete;
  ScheduleExecutor& operator=(const ScheduleExecutor&) = delete;

  // Activation slots a chunk needs (the most micro-batches it holds at once).
  int slots() const { return slots_; }
  const Schedule& table() const { return table_; }           // lowered, every rank's
  const std::vector<Action>& actions() const { return mine_; }  // this rank's
  const MicroBatching& batching() const { return mb_; }
  // Runs `compute` from the next step on: the same layout and micro-batches,
  // validated, needing no more activation slots than the stage has on any
  // rank (else false, nothing changed), and with I and W only if the first
  // table had them. Collective over the pipeline group, between steps, every
  // rank with the same table.
  bool replace_table(const Schedule& compute);

  StepOutput run(Stage& stage, const Loss& loss, const StepInput& in, GradSync& sync);

  // Every stage's measured per-micro-batch costs (each rank's StepTiming::chunks)
  // as the simulator takes them, each stage boundary's message bytes (one
  // micro-batch's f32 activation), and `link` per message. Collective over
  // the pipeline group.
  SimCosts gather_costs(const std::vector<ChunkTime>& mine, const LinkCost& link = {}) const;
  // The same for each of several steps (each rank passes the same number of
  // steps, each its chunks' costs in that step): one gather for all.
  std::vector<SimCosts> gather_costs(const std::vector<std::vector<ChunkTime>>& steps, const LinkCost& link) const;
  // The pipeline link, measured: a ping-pong between each pair of
  // neighbouring pipeline ranks in turn, through the transfers' own wait
  // (its naps included), `reps` round trips of 16 bytes and of the largest
  // boundary message, each side sleeping 1 ms before it sends (a stage
  // receives after waiting for its neighbour's compute: the wake-up delay of
  // a napping wait is part of a message's time); one way = (the median trip
  // less the sleeps as slept) / 2, the slowest pair. latency = the 16-byte
  // time, bandwidth from the difference (0 = free when the sizes do not
  // differ). Collective over the pipeline group.
  LinkCost measure_link(int reps = 20) const;

  // Forward only, in eval mode, along the pipeline; returns {loss sum,
  // correct} over the first `valid` samples on the last stage's tensor rank 0,
  // zeros elsewhere. Collective over the pipeline group.
  std::pair<double, std::int64_t> evaluate(Stage& stage, const Loss& loss, const Tensor& images,
                                           const Tensor& labels, std::int64_t valid);

 private:
  struct Transfers;
  int tag_of(int stage, int mb, bool act) const { return 2 * (stage * mb_.per_step() + mb) + (act ? 0 : 1); }
  const ProcessGrid& grid_;
  MicroBatching mb_;
  Schedule table_;
  bool splits_ = false;  // the table it was built for splits backwards (the stage is in split mode)
  std::vector<Action> mine_;
  int slots_ = 1;
  Device dev_;
  DeviceRuntime& rt_;
  // Buffers reused by every step (workspace, not step state), per chunk and
  // micro-batch: receive buffers where the neighbour chunk is remote.
  std::vector<std::vector<Tensor>> act_in_, grad_in_;
  std::vector<Tensor> dlogits_;  // per slot of the last chunk (the last layer keeps it for its W)
  std::vector<double> out_bytes_;  // per chunk: one micro-batch's output activation, bytes
};

// ScheduleExecutor::measure_link without an executor (parallel.schedule =
// auto measures before the layout is chosen): messages of 16 and `bytes`
// bytes (the largest the job sends) between neighbouring ranks of grid.pp().
LinkCost measure_pipeline_link(const ProcessGrid& grid, double bytes, int reps = 20);

}  // namespace ringtrain
