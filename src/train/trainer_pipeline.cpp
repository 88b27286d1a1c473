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

// Every pipeline's costs averaged over the world: each replica (data, tensor,
// context) timed its own stages, and all must build the same tables to run
// the same collectives in the same steps.
SimCosts mean_over_replicas(SimCosts c, const Communicator& world) {
  std::vector<double> v;
  for (const StageCost& s : c.stage) v.insert(v.end(), {s.f, s.i, s.w, s.whole});
  v.insert(v.end(), {c.link.latency_s, c.link.bytes_per_s});
  allreduce(v.data(), v.data(), v.size(), DType::f64, ReduceOp::sum, world);
  for (double& x : v) x /= static_cast<double>(world.size());  // each of a replica's ranks holds all its stages
  std::size_t k = 0;
  for (StageCost& s : c.stage) s = {v[k], v[k + 1], v[k + 2], v[k + 3]}, k += 4;
  c.link = {v[k], v[k + 1]};
  return c;
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
  const std::vector<double> plays =
      step_makespans(parts.executor->table(), parts.executor->gather_costs(steps, pipeline_link));
  // Medians beside the means: a step lasts as long as its slowest stage, and a
  // few slow steps (a stalled core) move the mean but not the median.
  std::vector<double> step_s(st.step_s.end() - static_cast<std::ptrdiff_t>(kept), st.step_s.end());
  allreduce(step_s.data(), step_s.data(), step_s.size(), DType::f64, ReduceOp::max, grid->pp());
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  double sum = 0;
  for (double x : plays) sum += x;
  m.schedule_predicted_steps_s = plays.empty() ? 0 : sum / static_cast<double>(plays.size());
  m.schedule_median_s = median(step_s);
  m.schedule_predicted_steps_median_s = median(plays);
  m.schedule_busiest_s = busiest_rank_s(parts.executor->table(), costs);
}

// parallel.replan_steps: the zero-bubble table rebuilt over measured costs,
// kept only where it runs faster. Tables are compared in alternate steps, so
// that the machine's drift (this 2-vCPU host's steps move 10-20% over a
// minute) falls on all of them alike. Phase 0 alternates the unit-cost table
// (F, I, W) with the same order with every backward whole (B), N steps each;
// the simulator then builds its pick over those costs (simulator.hpp
// replan_zero_bubble), and phase 1 alternates it with the faster of the two,
// N steps each. The run goes on with the fastest median step. Every pipeline
// rank gathers the same costs (averaged over the replicas), so all build the
// same tables; a median is the slowest rank's over the world, so all choose
// alike. The epoch's counters restart after every step of the comparison.
void Trainer::Impl::replan_step(EpochStats& st, double schedule_s, const std::vector<ChunkTime>& chunks) {
  const ScheduleKind kind = schedule_kind;
  const auto N = static_cast<std::size_t>(cfg.parallel.replan_steps);
  if (replan_tables.empty()) {
    if (grid->pp_size() == 1 || (kind != ScheduleKind::zb_h1 && kind != ScheduleKind::zb_v)) {
      replan_phase = 2;
      return;
    }
    const Schedule& unit = parts.executor->table();
    replan_tables = {{unit, "the unit-cost table", {}, {}}, {fuse_all(unit), "every backward whole", {}, {}}};
  }
  Timed& ran = replan_tables[replan_turn % replan_tables.size()];
  ran.step_s.push_back(schedule_s);
  ran.chunks.resize(chunks.size());
  for (std::size_t k = 0; k < chunks.size(); ++k) ran.chunks[k].add(chunks[k]);
  ++replan_turn;
  st.chunks.clear();
  st.step_chunks.clear();
  st.step_s.clear();
  st.schedule_s = 0;
  st.timed = 0;
  auto finish = [&](const Timed& keep) {
    RT_CHECK(parts.executor->replace_table(keep.table),
             "parallel.replan_steps: a table timed in this run no longer fits its activation slots");
    replan_phase = 2;
    replan_tables.clear();
  };
  if (replan_turn < N * replan_tables.size()) {
    if (!parts.executor->replace_table(replan_tables[replan_turn % replan_tables.size()].table))
      finish(replan_tables[0]);  // every backward whole needs more slots than the stage has: no comparison
    return;
  }
  // The phase is over: each table's median step, the slowest rank's.
  std::vector<double> median;
  for (Timed& t : replan_tables) {
    std::vector<double> v = t.step_s;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    median.push_back(v[v.size() / 2]);
  }
  allreduce(median.data(), median.data(), median.size(), DType::f64, ReduceOp::max, world);
  const std::size_t best = median[1] < median[0] ? 1 : 0;
  std::string timed;
  for (std::size_t k = 0; k < median.size(); ++k)
    timed += cat(k ? ", " : "", replan_tables[k].what, " ", 1e3 * median[k], " ms");
  const std::string name = schedule_name(kind);
  const auto steps = static_cast<double>(N);
  if (replan_phase == 0) {
    std::vector<ChunkTime> both = mean_chunks(replan_tables[0].chunks, steps);
    const std::vector<ChunkTime> whole = mean_chunks(replan_tables[1].chunks, steps);
    for (std::size_t k = 0; k < both.size(); ++k) {
      both[k].f = (both[k].f + whole[k].f) / 2;
      both[k].b = whole[k].b;  // those steps ran only whole backwards
    }
    if (pipeline_link.latency_s < 0) pipeline_link = parts.executor->measure_link();
    const SimCosts costs = mean_over_replicas(parts.executor->gather_costs(both, pipeline_link), world);
    const Replan plan = replan_zero_bubble(replan_tables[0].table, kind, costs);
    const bool fresh = plan.better() && lower(plan.table).ranks != replan_tables[0].table.ranks &&
                       lower(plan.table).ranks != replan_tables[1].table.ranks &&
                       parts.executor->replace_table(plan.table);  // it fits the stage's slots
    if (world.rank() == 0)
      log::info("parallel.schedule = ", name, ": median step over ", N, " alternate steps each: ", timed,
                "; the simulator plays the unit-cost table in ", 1e3 * plan.unit_s, " ms, ",
                fresh ? cat("a rebuilt one in ", 1e3 * plan.replanned_s, " ms (",
                            plan.table.split_backward() ? "" : "no backward split; ", "timing it against ",
                            replan_tables[best].what, "; as a parallel.schedule file:\n", schedule_csv(plan.table), ")")
                      : std::string("none other faster by 1%"));
    if (fresh) {
      replan_tables = {{replan_tables[best].table, replan_tables[best].what, {}, {}},
                       {lower(plan.table), "the rebuilt table", {}, {}}};
      replan_turn = 0;
      replan_phase = 1;
      RT_CHECK(parts.executor->replace_table(replan_tables[0].table), "parallel.replan_steps: a timed table no longer fits");
      return;
    }
  } else if (world.rank() == 0) {
    log::info("parallel.schedule = ", name, ": median step over ", N, " alternate steps each: ", timed);
  }
  if (world.rank() == 0)
    log::info("parallel.schedule = ", name, ": running ", replan_tables[best].what,
              replan_tables[best].what == "the unit-cost table" ? " (as --print-schedule shows it)" : "");
  finish(replan_tables[best]);
}

}  // namespace ringtrain
