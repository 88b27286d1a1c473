#include "ringtrain/parallel/updater.hpp"

#include <algorithm>
#include <cmath>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/optim/grad_utils.hpp"
#include "ringtrain/parallel/stage.hpp"

namespace ringtrain {

Updater::Updater(const ProcessGrid& grid, Stage& stage, const UpdateConfig& cfg, const OptimizerConfig& oc,
                 DeviceRuntime& rt)
    : grid_(grid), stage_(stage), cfg_(cfg), rt_(rt) {
  if (cfg.loss_scaling) scaler_ = std::make_unique<LossScaler>();
  if (cfg.zero == 0) {
    opt_ = rt.make_optimizer(stage.arena(), oc);
    return;
  }
  run_agreed(grid.world(), "setting up parallel.zero", [&] {
    RT_CHECK(cfg.zero >= 1 && cfg.zero <= 3, "parallel.zero = ", cfg.zero, " is not available (0 to 3 are)");
    // ZeRO-2/3 on a device: the stage's full buffers are chunked memory (parts.cpp), mapped only while held.
  });
  // ZeRO-1/2 slice a tied weight's two copies differently on their stages
  // (pipeline > 1). From 3 replicas a ring reduce-scatter may sum an element in
  // an order that depends on its slice, and at 2 LARS/LAMB add per-slice norms
  // that differ: the copies could differ in the last bit, so after each update
  // the copy takes its owner's values. (Without ZeRO, or ZeRO over 2 replicas
  // with another optimizer, both stages compute the same bits.)
  resync_tied_ = cfg.zero <= 2 && grid.pp_size() > 1 &&
                 (grid.dp_size() >= 3 || (grid.dp_size() == 2 && (oc.name == "lars" || oc.name == "lamb")));
  zero_ = std::make_unique<ShardedOptimizer>(stage.arena(), oc, grid.zero(), cfg.zero_collectives,
                                             [&rt](ParamArena& a, const OptimizerConfig& c) {
                                               return rt.make_optimizer(a, c);
                                             },
                                             [&rt](ParamArena& a, double f) { rt.unscale_grads(a, f); });
  if (grid.ep_size() > 1) average_dense_over_experts();
}

// Expert parallelism with ZeRO: ZeRO's group is then the expert-data ranks
// (grid.zero(): data x context, whose arenas hold the same experts), so the
// dense gradients, averaged over data x expert x context, are first averaged
// over the expert group, span by span of dense parameters, just before each
// range is reduce-scattered. Afterwards every expert rank holds the same dense
// slice and takes the same update: dense weights stay alike over the group
// (their optimizer state is sharded over data x context, not over experts).
void Updater::average_dense_over_experts() {
  const ParamArena& a = stage_.arena();
  std::vector<std::pair<DType, std::pair<std::size_t, std::size_t>>> spans;  // dense parameters, merged
  for (std::size_t i = 0; i < a.size(); ++i) {
    const ParamInfo& pi = a.info(i);
    if (pi.reduce_over != kDenseReduce) continue;
    const std::size_t lo = pi.offset, hi = lo + static_cast<std::size_t>(shape_numel(pi.shape));
    // Right after a dense parameter of its dtype: one span (the padding between is zero everywhere).
    if (i > 0 && a.info(i - 1).reduce_over == kDenseReduce && a.info(i - 1).dtype == pi.dtype)
      spans.back().second.second = hi;
    else
      spans.push_back({pi.dtype, {lo, hi}});
  }
  // Its own communicator: ZeRO-2 reduces on a worker thread while the backward's
  // all-to-alls use grid.ep().
  ep_dense_ = grid_.ep().dup("zero.expert");
  const ParamArena* arena = &a;
  const Communicator* ep = &ep_dense_;
  zero_->set_pre_reduce([spans, arena, ep](DType dt, std::size_t lo, std::size_t hi) {
    Tensor g = arena->grads_flat(dt);
    for (const auto& [t, r] : spans) {
      const std::size_t b = std::max(lo, r.first), e = std::min(hi, r.second);
      if (t != dt || b >= e) continue;
      char* p = static_cast<char*>(g.raw()) + b * dtype_size(dt);
      CollectiveOptions o;
      o.device = g.device();
      allreduce(p, p, e - b, dt, ReduceOp::avg, *ep, o);
    }
  });
}

Updater::~Updater() = default;

// Parameters whose gradients this rank contributes to the global norm:
// tensor-parallel shards everywhere, replicated parameters on tensor rank 0
// only (every tensor rank holds the same copy), and a tied weight on its
// owner's stage only (the last stage's copy holds the same gradient). A ZeRO
// slice's pieces map to the stage's parameters through full_index().
std::vector<char> Updater::counted_once(const ParamArena& a) const {
  const ParamArena& whole = stage_.arena();
  bool copies = false;
  for (const ParamInfo& pi : whole.infos()) copies = copies || pi.copy_of >= 0;
  // Expert parallelism: the dense weights are alike on the expert group (and,
  // with ZeRO, so are their slices): expert rank 0 counts them.
  const bool dense_here = grid_.mesh().coord(Dim::expert) == 0;
  if (grid_.tp_size() == 1 && !copies && dense_here) return {};  // all of them
  std::vector<char> keep(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const ParamInfo& pi = whole.info(zero_ ? zero_->full_index()[i] : i);
    keep[i] = (pi.shard.sharded() || grid_.tp_rank() == 0) && pi.copy_of < 0 &&
              (dense_here || pi.reduce_over != kDenseReduce);
  }
  return keep;
}

bool Updater::apply(double lr) {
  ParamArena& a = zero_ ? zero_->shard() : stage_.arena();
  const bool clip = cfg_.clip_norm > 0;
  // Expert parallelism: each rank's experts are its own, so the sums run over
  // the expert group too (with ZeRO the world already holds it).
  const Communicator& owners = zero_ ? grid_.world()
                               : grid_.ep_size() > 1 ? grid_.mesh().group({Dim::pipeline, Dim::expert, Dim::tensor})
                                                     : grid_.replica();
  double v[2] = {0, 0};  // sum of squares, non-finite count
  if (scaler_) v[1] = rt_.unscale_grads(a, scaler_->inv_scale()) ? 0 : 1;
  if (clip) v[0] = rt_.grad_sq_norm(a, counted_once(a));
  if (owners.size() > 1 && (scaler_ || clip)) allreduce(v, v, 2, DType::f64, ReduceOp::sum, owners);
  if (scaler_ && !scaler_->update(v[1] == 0)) return false;
  if (clip) {
    const double coef = clip_coefficient(std::sqrt(v[0]), cfg_.clip_norm);
    if (coef < 1.0)
      for (DType dt : a.dtypes()) {
        Tensor g = a.grads_flat(dt);
        rt_.scale(g, coef);
      }
  }
  if (zero_) zero_->step(lr);
  else opt_->step(lr);
  if (resync_tied_) resync_tied();
  return true;
}

// See the constructor: the last stage's copy of a tied weight takes the first
// stage's updated values (root: the first stage of grid.ends()).
void Updater::resync_tied() {
  if (grid_.pp_size() == 1) return;
  const ParamArena& a = stage_.arena();
  for (std::size_t i : a.tied()) {
    Tensor p = a.param(i);
    CollectiveOptions o;
    o.device = p.device();
    broadcast(p.raw(), static_cast<std::size_t>(p.numel()), p.dtype(), 0, grid_.ends(), o);
  }
}

std::size_t Updater::state_bytes() const {
  if (zero_) return zero_->state_bytes();
  std::size_t n = 0;
  for (const auto& [name, t] : opt_->state()) n += t.nbytes();
  return n;
}

}  // namespace ringtrain
