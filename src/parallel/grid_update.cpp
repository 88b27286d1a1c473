// The one update path of every layout, after the gradients are averaged:
//   fp16: unscale; a non-finite gradient anywhere skips the step on every rank;
//   clipping: the global norm over the whole model, each gradient counted once;
//   the optimizer step (ZeRO-1: the rank's slice, then the parameter all-gather).
// Partial results (a sum of squares, a non-finite count) are combined in one
// all-reduce over `owners_`, the ranks that together hold each gradient once:
// a replica's stages and tensor shards, or with ZeRO-1 every rank (each holds
// a slice of its replica's part). Pure data parallelism without ZeRO-1 needs
// none: every rank holds the whole, identical, averaged gradients.
#include <cmath>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/optim/grad_utils.hpp"
#include "ringtrain/parallel/grid_model.hpp"

namespace ringtrain {

// Parameters whose gradients this rank contributes to the global norm:
// tensor-parallel shards everywhere, replicated parameters on tensor rank 0
// only (every tensor rank holds the same copy). `full_index` maps a ZeRO slice's
// pieces to the stage's parameters.
std::vector<char> GridModel::counted_once(const ParamArena& a, const std::vector<std::size_t>* full_index) const {
  if (grid_.tp_size() == 1) return {};  // all of them
  const ParamArena& stage = stage_->arena();
  std::vector<char> keep(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::size_t p = full_index ? (*full_index)[i] : i;
    keep[i] = stage.info(p).shard.sharded() || grid_.tp_rank() == 0;
  }
  return keep;
}

bool GridModel::update(double lr) {
  ParamArena& a = zero_ ? zero_->shard() : stage_->arena();
  const bool clip = pc_.clip_norm > 0;
  // [sum of squares, non-finite count]
  double v[2] = {0, 0};
  if (scaler_) v[1] = rt_.unscale_grads(a, scaler_->inv_scale()) ? 0 : 1;
  if (clip) v[0] = rt_.grad_sq_norm(a, counted_once(a, zero_ ? &zero_->full_index() : nullptr));
  if (owners_.size() > 1 && (scaler_ || clip)) allreduce(v, v, 2, DType::f64, ReduceOp::sum, owners_);
  if (scaler_ && !scaler_->update(v[1] == 0)) return false;
  if (clip) {
    const double coef = clip_coefficient(std::sqrt(v[0]), pc_.clip_norm);
    if (coef < 1.0)
      for (DType dt : a.dtypes()) {
        Tensor g = a.grads_flat(dt);
        rt_.scale(g, coef);
      }
  }
  if (zero_) zero_->step(lr);
  else opt_->step(lr);
  return true;
}

GridMemory GridModel::memory() const {
  GridMemory m;
  const ParamArena& a = stage_->arena();
  for (DType dt : a.dtypes()) {
    m.params += a.params_flat(dt).nbytes();
    m.grads += a.grads_flat(dt).nbytes();
  }
  m.param_count = a.numel();
  if (zero_) {
    m.optimizer = zero_->state_bytes();
  } else {
    for (const auto& [name, t] : opt_->state()) m.optimizer += t.nbytes();
  }
  return m;
}

}  // namespace ringtrain
