#pragma once
// Updater: the one update path of every layout, after the gradients are
// synchronised (GradSync::finish):
//   fp16: unscale; a non-finite gradient anywhere skips the step on every rank;
//   clipping: the global norm over the whole model, each gradient counted once;
//   the optimizer step (ZeRO-1/2: the rank's slice, then the parameter all-gather;
//   ZeRO-3: the slice alone, the next use gathers).
//
// Partial results (a sum of squares, a non-finite count) are combined in one
// all-reduce over the ranks that together hold each gradient once: the
// replica (grid.replica(): its stages and tensor shards), or with ZeRO-1/2 the
// world (each rank holds a slice of its replica's part); with expert
// parallelism the replica's expert group too (every rank holds its own experts:
// pipeline x expert x tensor). Pure data parallelism
// without ZeRO needs none: every rank holds the whole averaged gradients.
#include <memory>
#include <vector>

#include "ringtrain/optim/loss_scale.hpp"
#include "ringtrain/optim/optimizer.hpp"
#include "ringtrain/optim/sharded_optimizer.hpp"
#include "ringtrain/parallel/device_runtime.hpp"
#include "ringtrain/parallel/grid.hpp"

namespace ringtrain {

class Stage;

struct UpdateConfig {
  double clip_norm = 0;          // > 0: clip to this global norm over the whole model
  bool loss_scaling = false;     // train.precision = fp16: dynamic loss scaling
  int zero = 0;                  // ZeRO stage over the data-parallel group (parallel.zero: 0 to 3)
  CollectiveOptions zero_collectives;  // its reduce-scatter / all-gather
};

class Updater {
 public:
  // Collective over the world (ZeRO builds its slices over grid.zero()).
  Updater(const ProcessGrid& grid, Stage& stage, const UpdateConfig& cfg, const OptimizerConfig& oc,
          DeviceRuntime& rt);
  ~Updater();

  // Applies the step's synchronised gradients with learning rate lr; false
  // when fp16 found a non-finite gradient (the same answer on every rank).
  bool apply(double lr);

  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  LossScaler* scaler() { return scaler_.get(); }
  Optimizer* optimizer() { return opt_.get(); }       // null with ZeRO
  ShardedOptimizer* zero() { return zero_.get(); }    // null without it
  const ShardedOptimizer* zero() const { return zero_.get(); }
  std::size_t state_bytes() const;                    // this rank's optimizer state

 private:
  std::vector<char> counted_once(const ParamArena& a) const;
  void resync_tied();
  void average_dense_over_experts();  // ZeRO with parallel.expert > 1 (see updater.cpp)  // a tied weight's copy takes its owner's values (see updater.cpp)

  const ProcessGrid& grid_;
  Stage& stage_;
  UpdateConfig cfg_;
  DeviceRuntime& rt_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<ShardedOptimizer> zero_;
  std::unique_ptr<LossScaler> scaler_;
  bool resync_tied_ = false;
  Communicator ep_dense_;  // ZeRO with parallel.expert > 1: the dense gradients' average over the expert group  // ZeRO: a tied weight's copy takes its owner's values after each update
};

}  // namespace ringtrain
