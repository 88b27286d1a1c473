// The trainer's update, with or without ZeRO-1 (parallel.shard_optimizer):
// building the sharded optimizer and reporting its memory, and the step after
// the gradients are averaged (fp16 unscaling, clipping, the optimizer).
//
// Trade-off: with sharding the gradients are reduce-scattered once after
// backward (one call per dtype), not in buckets overlapping backward as the
// engine's all-reduce is; the all-gather of the parameters follows the update.
// Bytes on the wire equal a ring all-reduce's (reduce-scatter + all-gather).
#include <cstdlib>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/core/log.hpp"
#include "trainer_impl.hpp"

namespace ringtrain {

void Trainer::Impl::build_sharded_optimizer(const OptimizerConfig& oc) {
  // The device is agreed by every rank, so this error is raised on every rank.
  RT_CHECK(device.is_cpu(), "parallel.shard_optimizer needs train.device = cpu: its reduce-scatter and all-gather "
           "are host-only (this run chose ", device.str(), ")");
  CollectiveOptions co;
  co.algorithm = parse_algorithm(cfg.comm.algorithm);
  Communicator group = world.dup("zero");
  // Its collectives time out like the trainer's own (trainer.cpp, Impl::Impl).
  if (!std::getenv("RINGTRAIN_COLLECTIVE_TIMEOUT") && group.size() > 1)
    host_context(group.handle(), group.local_size()).timeout_s = cfg.comm.collective_timeout_s;
  zero = std::make_unique<ShardedOptimizer>(model->arena(), oc, group, co,
                                            [this](ParamArena& a, const OptimizerConfig& c) {
                                              return rt->make_optimizer(a, c);
                                            });
  const auto [per_rank, unsharded] = zero->state_bytes_summary();
  if (world.rank() == 0 && hooks.report)
    log::info("ZeRO-1: optimizer '", oc.name, "' state ", per_rank, " bytes per rank (largest slice) over ",
              world.size(), " rank(s); unsharded ", unsharded, " bytes per rank");
}

// The gradients are averaged here (all-reduced, or reduce-scattered into this
// rank's slice); every rank takes the same decision on skipping (fp16).
bool Trainer::Impl::apply_update(double lr) {
  if (zero) {
    if (scaler && !scaler->update(zero->unscale_grads(scaler->inv_scale()))) return false;
    if (cfg.optimizer.clip_norm > 0) zero->clip_grad_norm(cfg.optimizer.clip_norm);
    zero->step(lr);
    return true;
  }
  if (scaler && !scaler->update(rt->unscale_grads(model->arena(), scaler->inv_scale()))) return false;
  if (cfg.optimizer.clip_norm > 0) rt->clip_grad_norm(model->arena(), cfg.optimizer.clip_norm);
  optimizer->step(lr);
  return true;
}

}  // namespace ringtrain
