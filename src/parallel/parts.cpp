// Building a rank's parts, and the training step that composes them.
#include "ringtrain/parallel/parts.hpp"

#include <chrono>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/trace.hpp"
#include "ringtrain/nn/model_registry.hpp"
#include "ringtrain/parallel/simulator.hpp"

namespace ringtrain {

ModelParts build_parts(const ProcessGrid& grid, const ModelConfig& mc, const GridConfig& gc,
                       const OptimizerConfig& oc, Device dev, DeviceRuntime* runtime) {
  DeviceRuntime& rt = runtime ? *runtime : device_runtime(dev.kind);
  const MicroBatching mb{gc.micro_batches, gc.accumulation, gc.batch};
  run_agreed(grid.world(), "setting up the process grid", [&] {
    RT_CHECK(mb.micro_batches >= 1 && mb.batch > 0 && mb.batch % mb.micro_batches == 0, "data.batch_size = ",
             mb.batch, " is not divisible by parallel.micro_batches = ", mb.micro_batches);
  });
  ModelParts parts;
  ModelConfig mc_tp = mc;  // parallel.tensor: the model splits its layers over grid.tp()
  mc_tp.tensor = TensorGroup::of(grid.tp(), mc.tensor.stats);  // stats: the caller's counter, if any
  if (grid.cp_size() > 1) {  // ring or all-to-all attention (nn/context_parallel.hpp)
    mc_tp.context = ContextGroup::of(grid.cp(), mc.seq_len, mc.context.stats);
    mc_tp.context.mode = mc.context.mode;
  }
  mc_tp.expert.comm = grid.ep();  // parallel.expert: the experts split over grid.ep() (nn/moe.hpp)
  mc_tp.expert.size = grid.ep_size();
  mc_tp.expert.rank = grid.mesh().coord(Dim::expert);
  if (mc.experts > 0) parts.moe = mc.expert.shared;
  parts.per_step = mb.per_step();
  // Nothing of the whole model is allocated: the partition works from what each
  // layer registers (or times layers one by one), the stage builds its own layers.
  const std::vector<LayerPlan> plan = plan_model_layers(mc_tp, dev);
  const PipelineLayout& L = grid.pipeline_layout();
  Schedule table;
  run_agreed(grid.world(), "making the pipeline schedule", [&] {
    table = step_schedule(gc.schedule, gc.schedule_file, grid.pp_size(), mb.per_step(), gc.virtual_stages);
    RT_CHECK(table.layout == L, "parallel.schedule = ", gc.schedule == ScheduleKind::file ? gc.schedule_file
             : schedule_name(gc.schedule), " runs ", table.layout.chunks, " model chunks per rank, the process grid "
             "was made for ", L.chunks);
  });
  run_agreed(grid.world(), "partitioning the model into stages", [&] {
    const int n = static_cast<int>(plan.size()), p = L.stages();
    check_chunk_cut(n, grid.pp_size(), L.chunks,
                    gc.schedule == ScheduleKind::file ? gc.schedule_file : schedule_name(gc.schedule));
    switch (gc.partition) {
      case PartitionKind::uniform: parts.balance = balance_uniform(n, p); break;
      case PartitionKind::params: parts.balance = balance_by_play(layer_param_costs(plan), table); break;
      case PartitionKind::list: parts.balance = check_balance_list(gc.balance, n, p); break;
      case PartitionKind::time: parts.balance = balance_by_play(layer_time_costs(mc_tp, dev, mb.size()), table); break;
    }
  });
  // Timings differ per rank: every rank takes world rank 0's cut.
  broadcast(parts.balance.data(), parts.balance.size(), DType::i32, 0, grid.world());
  // This rank's chunks, in stage order, and their boundary shapes.
  std::vector<LayerRange> chunks;
  std::vector<std::pair<Shape, Shape>> shapes;
  for (int k = 0; k < L.chunks; ++k) {
    const int g = L.stage_of(grid.pp_rank(), k);
    LayerRange c;
    for (int s = 0; s < g; ++s) c.first += parts.balance[static_cast<std::size_t>(s)];
    c.end = c.first + parts.balance[static_cast<std::size_t>(g)];
    chunks.push_back(c);
    shapes.push_back(Stage::boundary_shapes(mc_tp, dev, c.first, c.end, mb.size()));
  }
  // The executor knows the slots the schedule needs: the stage is built after it.
  parts.executor = std::make_unique<ScheduleExecutor>(grid, table, mb, shapes, dev, rt);
  // Agreed: a stage's layers can refuse their range (a tied LM head on a middle stage).
  run_agreed(grid.world(), "building the pipeline stages", [&] {
    // ZeRO-2/3 give chunks of the full buffers back: on a device they need chunked memory.
    parts.stage = std::make_unique<Stage>(mc_tp, dev, chunks, parts.executor->slots(), gc.update.zero >= 2);
    check_tied_stages(grid, *parts.stage);
    // The last stage's last layer may ask for its own loss (split logits); a registered model may bring one.
    Stage& st = *parts.stage;
    parts.loss = model_loss(mc_tp, grid.last_stage() && st.num_layers() > 0 ? &st.layer(st.num_layers() - 1) : nullptr);
    if (mc_tp.context.size > 1) parts.loss = context_loss(parts.loss, mc_tp.context);  // reduced over context once
  });
  // BatchNorm: per-micro-batch normalisation, running statistics over the whole step (stage.hpp).
  if (mb.per_step() > 1) parts.stage->set_deferred_batch_stats(true);
  // Only zero-bubble schedules defer the weight gradients; the others run each
  // layer's backward whole (its gradients go to the synchronisation at once).
  parts.stage->set_fused_backward(!table.split_backward());
  parts.stage->set_recompute(gc.recompute);
  parts.updater = std::make_unique<Updater>(grid, *parts.stage, gc.update, oc, rt);
  // Agreed: only the pipeline's ends hold a tied weight, so a refusal here must reach every stage.
  run_agreed(grid.world(), "setting up the gradient synchronisation", [&] {
    // ZeRO-3 cuts the two copies of a tied weight into differently placed slices:
    // from 3 replicas a ring reduce-scatter may sum an element in another order
    // on each stage, and LARS/LAMB add per-slice norms, so the copies could part
    // in the last bit; ZeRO-1/2 then give the copy its owner's values after the
    // update (Updater::resync_tied), which ZeRO-3 cannot: it owns only slices.
    RT_CHECK(!(gc.update.zero == 3 && grid.pp_size() > 1 && !parts.stage->arena().tied().empty() &&
               (grid.dp_size() >= 3 || oc.name == "lars" || oc.name == "lamb")),
             "parallel.zero = 3 with parallel.pipeline = ", grid.pp_size(), ": the tied weight ",
             parts.stage->arena().info(parts.stage->arena().tied().front()).name, " has a copy on each end of the "
             "pipeline, and ZeRO-3 keeps the copies bitwise equal only over at most 2 data-parallel ranks (here ",
             grid.dp_size(), ") with an element-wise optimizer (here '", oc.name, "'): use parallel.zero = 1 or 2");
    parts.grad_sync = with_tied_grads(grid, *parts.stage, make_grad_sync(grid, *parts.stage, gc, rt, parts.updater->zero()));
  });
  parts.stage->set_param_access(parts.grad_sync->param_access());  // ZeRO-3: gather before use
  parts.state = std::make_unique<ModelState>(grid, *parts.stage, *parts.updater);
  return parts;
}

// The step, as the algorithm reads:
//   run the schedule over the micro-batches (forward, loss, backward; each
//   layer's gradient handed to the synchronisation as soon as it exists),
//   wait for the gradients to be synchronised, update (or skip), and sum the
//   statistics and flags of every rank.
StepResult train_step(const ProcessGrid& grid, ModelParts& parts, const StepInput& in, StepFlags flags) {
  using Clock = std::chrono::steady_clock;
  if (parts.moe) parts.moe->grad_scale = in.loss_scale / parts.per_step;  // the aux loss's, like the executor's dy
  StepOutput out = parts.executor->run(*parts.stage, *parts.loss, in, *parts.grad_sync);
  const auto t_sync = Clock::now();
  parts.grad_sync->finish();
  const auto t_update = Clock::now();
  out.timing.reduce_s = std::chrono::duration<double>(t_update - t_sync).count();
  trace::span("wait", "gradient sync", t_sync, t_update);
  {
    const trace::Scope span("compute", "optimizer");
    out.stats.skipped = !parts.updater->apply(in.lr);
  }
  // Aux-loss-free balancing (nn/moe.hpp): the step's loads over every rank that
  // split its tokens; a skipped step leaves the bias as it leaves the weights.
  if (parts.moe && parts.moe->balanced())
    parts.moe->update_bias(&grid.reduce_group(kDenseReduce), !out.stats.skipped);
  out.timing.busy_s += std::chrono::duration<double>(Clock::now() - t_update).count();
  out.timing.wall_s += std::chrono::duration<double>(Clock::now() - t_sync).count();
  out.stats.stop = flags.stop;
  out.stats.save = flags.save;
  out.stats.parts_pending = !flags.checkpoint_ready;
  return {reduce(out.stats, grid.world()), out.timing};
}

StepResult train_step(const ProcessGrid& grid, ModelParts& parts, const Tensor& images, const Tensor& labels,
                      double lr, std::int64_t step) {
  StepInput in;
  in.images = {images};
  in.labels = {labels};
  in.step = step;
  in.lr = lr;
  in.loss_scale = parts.updater->loss_scale();
  return train_step(grid, parts, in);
}

StepStats reduce(const StepStats& mine, const Communicator& comm) {
  double v[6] = {mine.loss_sum, static_cast<double>(mine.samples), static_cast<double>(mine.correct),
                 static_cast<double>(mine.stop), static_cast<double>(mine.save),
                 static_cast<double>(mine.parts_pending)};
  if (comm.size() > 1) allreduce(v, v, 6, DType::f64, ReduceOp::sum, comm);
  StepStats all;
  all.loss_sum = v[0];
  all.samples = static_cast<std::int64_t>(v[1]);
  all.correct = static_cast<std::int64_t>(v[2]);
  all.stop = static_cast<int>(v[3]);
  all.save = static_cast<int>(v[4]);
  all.parts_pending = static_cast<int>(v[5]);
  all.skipped = mine.skipped;
  return all;
}

GridMemory memory(const ModelParts& parts) {
  GridMemory m;
  const ParamArena& a = parts.stage->arena();
  const bool sliced = parts.grad_sync->shards_grads();
  const ParamArena& g = sliced ? parts.updater->zero()->shard() : a;
  const ShardedOptimizer* zero = parts.updater->zero();
  const ParamArena& p = zero && zero->params_sharded() ? zero->shard() : a;
  for (DType dt : p.dtypes()) m.params += p.params_flat(dt).nbytes();
  for (DType dt : g.dtypes()) m.grads += g.grads_flat(dt).nbytes();
  m.grads_in_flight = parts.grad_sync->grad_bytes_in_flight();
  m.params_in_flight = parts.grad_sync->param_bytes_in_flight();
  m.param_count = a.numel();
  m.optimizer = parts.updater->state_bytes();
  return m;
}

}  // namespace ringtrain
