#pragma once
// The values one optimizer step takes and gives, on every layout.
//
//   StepOutput out = executor.run(stage, StepInput{images, labels, step, lr, scale}, grad_sync);
//   grad_sync.finish();                   // gradients synchronised over the data-parallel group
//   out.stats.skipped = !updater.apply(lr);
//   StepStats all = reduce(out.stats, grid.world());
//
// Rules:
//  - StepInput holds this replica's `accumulation` loader batches (B samples
//    each); the first stage reads the images, the last the labels (other
//    stages may pass undefined tensors).
//  - StepStats are counted where they arise: the loss and the correct
//    predictions by the rank that holds the logits once per replica (last
//    stage, tensor rank 0), the flags by every rank. reduce() sums them over a
//    communicator in one all-reduce, in float64 (never compressed with the
//    gradients), so the global mean loss is loss_sum / samples.
#include <cstdint>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/tensor.hpp"

namespace ringtrain {

struct StepInput {
  std::vector<Tensor> images, labels;  // `accumulation` loader batches of this replica
  std::int64_t step = 0;               // the run's optimizer step (dropout masks)
  double lr = 0;
  double loss_scale = 1;               // fp16: the loss is scaled up before backward
};

// Counts of one step. On one rank they are this rank's share; after reduce()
// they are the job's sums (every rank gets them).
struct StepStats {
  double loss_sum = 0;           // sum of the per-sample losses
  std::int64_t samples = 0;      // samples in loss_sum
  std::int64_t correct = 0;      // of those, predicted right
  int stop = 0;                  // ranks with a stop signal pending
  int save = 0;                  // ranks whose clock says a checkpoint is due
  int parts_pending = 0;         // ranks whose part of a checkpoint in flight is not yet durable
  bool skipped = false;          // fp16: a non-finite gradient somewhere, no update (alike on every rank)

  double mean_loss() const { return samples > 0 ? loss_sum / static_cast<double>(samples) : 0; }
};

// Sums every count over `comm` (one float64 all-reduce); `skipped` is kept.
StepStats reduce(const StepStats& mine, const Communicator& comm);

// Per action: mean seconds of a chunk's forward, input gradient, weight
// gradient and whole backward in one step: what the schedule simulator
// (parallel/simulator.hpp) plays. A chunk that ran whole backwards only also
// counts them as input gradient (i = b, w = 0), so i + w is its backward on
// every table; b is 0 where it ran none.
struct ChunkTime {
  double f = 0, i = 0, w = 0, b = 0;
  void add(const ChunkTime& o, double scale = 1) {
    f += scale * o.f;
    i += scale * o.i;
    w += scale * o.w;
    b += scale * o.b;
  }
};
// The means from per-op sums and counts (executor).
ChunkTime per_action(const ChunkTime& sum, const ChunkTime& count);

// Where this rank's step time went.
struct StepTiming {
  std::vector<ChunkTime> chunks;  // this rank's chunks, in chunk order
  double schedule_s = 0;          // the pipeline schedule alone (the executor), start to end
  double wall_s = 0;    // the step, start to end
  double busy_s = 0;    // in load/forward/loss/backward ops
  double reduce_s = 0;  // waiting for the data-parallel gradient synchronisation (exposed communication)
  double bubble() const { return wall_s > 0 ? 1.0 - busy_s / wall_s : 0; }
  // Idle, waiting for other pipeline stages (the rest of the step).
  double wait_s() const { return wall_s > busy_s + reduce_s ? wall_s - busy_s - reduce_s : 0; }
};

struct StepOutput {
  StepStats stats;
  StepTiming timing;
};

}  // namespace ringtrain
