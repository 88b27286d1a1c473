// The trainer's pipeline schedule: parallel.schedule = auto's pick at start,
// the zero-bubble table rebuilt from the first steps' measured costs
// (parallel.replan_steps), and each epoch's prediction beside the measured step.
#include <algorithm>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/parallel/simulator.hpp"
#include "trainer_impl.hpp"

namespace ringtrain {

namespace {

// Per chunk: the mean per-action costs over the epoch's timed steps so far.
std::vector<ChunkTime> mean_chunks(const std::vector<ChunkTime>& sums, double steps) {
  std::vector<ChunkTime> mean;
  for (const ChunkTime& c : sums) mean.push_back({c.f / steps, c.i / steps, c.w / steps, c.b / steps});
  return mean;
}

}  // namespace

// parallel.schedule = auto: the simulator's pick for this model's layer
// times (forward + backward, measured on rank 0 as partition = time, and
// shared), each cut's message bytes and the pipeline link (given, or measured
// now by a ping-pong between neighbouring stages).
void Trainer::Impl::choose_schedule(const ModelConfig& mc, GridConfig& pc) {
  const int p = grid->pp_size(), m = pc.micro_batches * pc.accumulation;
  pc.schedule = ScheduleKind::one_f_one_b;
  if (p == 1) return;
  PlanInput in;
  run_agreed(world, "timing the layers (parallel.schedule = auto)", [&] {
    if (world.rank() == 0)
      in.layer_costs = layer_time_costs(mc, device, std::max<std::int64_t>(1, pc.batch / pc.micro_batches), 3,
                                        &in.layer_out_bytes);
  });
  std::int64_t n = static_cast<std::int64_t>(in.layer_costs.size());
  broadcast(&n, 1, DType::i64, 0, world);
  in.layer_costs.resize(static_cast<std::size_t>(n));
  in.layer_out_bytes.resize(static_cast<std::size_t>(n));
  broadcast(in.layer_costs.data(), in.layer_costs.size(), DType::f64, 0, world);
  broadcast(in.layer_out_bytes.data(), in.layer_out_bytes.size(), DType::f64, 0, world);
  if (pipeline_link.latency_s < 0) {
    double big = 16;
    for (double b : in.layer_out_bytes) big = std::max(big, b);
    pipeline_link = measure_pipeline_link(*grid, big);
  }
  in.link = pipeline_link;
  in.ranks = p;
  in.micro_batches = m;
  in.virtual_stages = pc.virtual_stages;
  in.uniform_cut = pc.partition == PartitionKind::uniform;
  std::string why;
  pc.schedule = pick_schedule(in, &why);
  grid->set_pipeline_layout(layout_for(pc.schedule, p, pc.virtual_stages));
  if (world.rank() == 0)
    log::info("parallel.schedule = auto: ", schedule_name(pc.schedule), " (the simulator's steps from the layers' "
              "measured times, messages at ", 1e6 * pipeline_link.latency_s, " us + ",
              pipeline_link.bytes_per_s > 0 ? cat(pipeline_link.bytes_per_s / 1e9, " GB/s") : std::string("bytes free"),
              ": ", why, ")");
}

void Trainer::Impl::predict_schedule(const EpochStats& st, EpochMetrics& m) {
  if (grid->pp_size() == 1) return;
  double n = static_cast<double>(st.timed), mine[2] = {st.schedule_s, n};
  allreduce(mine, mine, 2, DType::f64, ReduceOp::min, grid->pp());  // every stage timed the same steps
  if (mine[1] < 1) return;
  const std::vector<ChunkTime> mean = mean_chunks(st.chunks, n);
  double step = st.schedule_s / n;
  allreduce(&step, &step, 1, DType::f64, ReduceOp::max, grid->pp());  // the step ends with its slowest stage
  if (pipeline_link.latency_s < 0) pipeline_link = parts.executor->measure_link();
  const SimCosts costs = parts.executor->gather_costs(mean, pipeline_link);
  const SimResult sim = simulate(parts.executor->table(), costs);
  m.schedule_s = step;
  m.schedule_predicted_s = sim.makespan;
  m.schedule_predicted_free_s = simulate(parts.executor->table(), parts.executor->gather_costs(mean)).makespan;
  m.pipeline_message_s = costs.message_s(0);
  m.schedule_bubble_predicted = sim.mean_bubble();
  for (const StageCost& c : costs.stage) m.schedule_stage_fiw.push_back({c.f, c.i, c.w, c.whole});
  // Each step played with its own costs: the stages' step-to-step variation
  // lengthens the mean step beyond the play of the mean costs.
  double kept = static_cast<double>(st.step_chunks.size());
  allreduce(&kept, &kept, 1, DType::f64, ReduceOp::min, grid->pp());
  const std::vector<std::vector<ChunkTime>> steps(st.step_chunks.end() - static_cast<std::ptrdiff_t>(kept),
                                                  st.step_chunks.end());
  m.schedule_predicted_steps_s = mean_makespan(parts.executor->table(), parts.executor->gather_costs(steps, pipeline_link));
}

// parallel.replan_steps: the zero-bubble table rebuilt over measured costs.
// Phase 0 timed the unit-cost table (F, I, W); phase 1 runs the same order
// with every backward whole, to time B; then the simulator picks (simulator.hpp
// replan_zero_bubble). Every pipeline rank gathers the same costs, so all
// build the same tables and change together; the epoch's counters restart
// at each change, as its steps ran another table.
void Trainer::Impl::replan_schedule(EpochStats& st) {
  const ScheduleKind kind = schedule_kind;
  if (grid->pp_size() == 1 || (kind != ScheduleKind::zb_h1 && kind != ScheduleKind::zb_v)) {
    replan_phase = 2;
    return;
  }
  auto restart = [&] {
    st.chunks.clear();
    st.step_chunks.clear();
    st.schedule_s = 0;
    st.timed = 0;
  };
  const std::vector<ChunkTime> mean = mean_chunks(st.chunks, static_cast<double>(st.timed));
  const int steps = cfg.parallel.replan_steps;
  if (replan_phase == 0) {
    replan_split = mean;
    unit_table = parts.executor->table();
    if (parts.executor->replace_table(fuse_all(unit_table))) {
      replan_phase = 1;
      restart();
    } else {
      replan_phase = 2;
    }
    return;
  }
  replan_phase = 2;
  std::vector<ChunkTime> both = replan_split;
  for (std::size_t k = 0; k < both.size(); ++k) {
    both[k].f = (both[k].f + mean[k].f) / 2;
    both[k].b = mean[k].b;  // phase 1 ran only whole backwards
  }
  if (pipeline_link.latency_s < 0) pipeline_link = parts.executor->measure_link();
  const SimCosts costs = parts.executor->gather_costs(both, pipeline_link);
  const Replan plan = replan_zero_bubble(unit_table, kind, costs);
  const bool changed = parts.executor->replace_table(plan.better() ? plan.table : unit_table);
  RT_CHECK(changed, "parallel.replan_steps: the unit-cost table no longer fits its own activation slots");
  if (world.rank() == 0)
    log::info("parallel.schedule = ", schedule_name(kind), ": over ", steps, " steps split and ", steps,
              " whole, the simulator plays the unit-cost table in ", 1e3 * plan.unit_s, " ms, ",
              plan.better() ? cat("a rebuilt one in ", 1e3 * plan.replanned_s, " ms: running it (",
                                  plan.table.split_backward() ? "" : "no backward split; ", "--print-schedule shows the unit-cost one)")
                            : std::string("and none faster by 1%: keeping it"));
  restart();
}

}  // namespace ringtrain
