#pragma once
// ScheduleExecutor: runs one stage's schedule (schedule.hpp) for one
// optimizer step over the grid's pipeline communicator. Every layout runs it:
// a single stage (data or tensor parallelism) is the schedule F, B, W per
// micro-batch. It takes the step's inputs as a value and returns its counts
// and timing; nothing of a step outlives run().
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
//  - Gradients: the last micro-batch's backward tells grad_sync each layer
//    whose step gradient is complete (layer_ready), so synchronisation
//    overlaps the rest of the backward.
//  - Transfers: activation/gradient shapes are known ahead (from the model),
//    so receive buffers (one per micro-batch and direction) are allocated once
//    and every receive of a step is posted when the step starts; sends are
//    non-blocking from the slot's own output, completed before that slot is
//    reused and at the end of the step. A list can therefore only wait in
//    RecvAct/RecvGrad, which the schedule tests prove cannot deadlock.
//  - Construction is collective over the pipeline group: neighbours exchange
//    the shape they will send / expect; a mismatch is an Error on every rank
//    of the world naming both stages and shapes.
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
  // in_mb / out_mb: this stage's input and output shapes for one micro-batch.
  ScheduleExecutor(const ProcessGrid& grid, ScheduleKind kind, MicroBatching mb, Shape in_mb, Shape out_mb,
                   Device dev, DeviceRuntime& rt);
  ~ScheduleExecutor();
  ScheduleExecutor(const ScheduleExecutor&) = delete;
  ScheduleExecutor& operator=(const ScheduleExecutor&) = delete;

  int slots() const { return slots_; }
  const std::vector<Instr>& schedule() const { return sched_; }
  const MicroBatching& batching() const { return mb_; }

  StepOutput run(Stage& stage, const Loss& loss, const StepInput& in, GradSync& sync);

  // Forward only, in eval mode, along the pipeline; returns {loss sum,
  // correct} over the first `valid` samples on the last stage's tensor rank 0,
  // zeros elsewhere. Collective over the pipeline group.
  std::pair<double, std::int64_t> evaluate(Stage& stage, const Loss& loss, const Tensor& images,
                                           const Tensor& labels, std::int64_t valid);

 private:
  struct Transfers;
  const ProcessGrid& grid_;
  MicroBatching mb_;
  std::vector<Instr> sched_;
  int slots_ = 1;
  Device dev_;
  DeviceRuntime& rt_;
  // Buffers reused by every step (workspace, not step state).
  std::vector<Tensor> act_in_, grad_in_;  // per micro-batch receive buffers
  std::vector<Tensor> dlogits_;           // per slot (the last layer keeps it for its W)
};

}  // namespace ringtrain
