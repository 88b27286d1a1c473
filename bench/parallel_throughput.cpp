// Throughput at 2 ranks, real layers: `resnet` as a 2-stage pipeline under
// every schedule (m micro-batches, one replica) next to pure data parallelism
// over the same 2 ranks (each rank the whole model, half the batch, gradients
// averaged by the fusion engine), same global batch, in one run. The DP
// reference runs through the same parts with one stage (p = 1, m = 1), which is
// the trainer's own step for data parallelism. Per schedule it prints the
// bound m/(m+p-1) x DP (1F1B's bubble on balanced stages), the schedule's
// measured step beside the simulator's prediction from the per-chunk costs
// the executor measured, and those costs (F, I, W ms per micro-batch per
// stage; a whole backward counts in I): where a zero-bubble schedule's split
// backward costs more than the fused one, it shows there.
// Run: mpirun -np 2 bench_parallel_throughput [--batch 128 --m 8 --steps 8]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include <CLI/CLI.hpp>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/nn/rng.hpp"
#include "ringtrain/parallel/parts.hpp"
#include "ringtrain/parallel/simulator.hpp"

using namespace ringtrain;

namespace {

std::string fixed(double v, int digits) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

struct Result {
  double images_per_s = 0, bubble = 0, schedule_ms = 0, predicted_ms = 0;
  std::vector<StageCost> costs;  // per stage, ms
};

Result measure(const Communicator& world, int p, int m, std::int64_t global, int steps, ScheduleKind kind) {
  const PipelineLayout L = layout_for(kind, p, 2);
  ProcessGrid grid = ProcessGrid::make(world, {p, 1, 1, L.chunks, L.placement});
  ModelConfig mc;
  mc.name = "resnet";
  mc.in_channels = 3;
  mc.height = mc.width = 32;
  mc.depth = 20;
  GridConfig pc;
  pc.micro_batches = m;
  pc.schedule = kind;
  pc.partition = PartitionKind::time;
  pc.batch = global / grid.dp_size();
  OptimizerConfig oc;
  oc.momentum = 0.9;
  ModelParts pm = build_parts(grid, mc, pc, oc);
  Tensor x = Tensor::empty({pc.batch, 3, 32, 32});
  Tensor y = Tensor::empty({pc.batch}, DType::i64);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = counter_uniform(3, 0, static_cast<std::uint64_t>(i)) - 0.5f;
  for (std::int64_t i = 0; i < pc.batch; ++i) y.data<std::int64_t>()[i] = i % 10;
  train_step(grid, pm, x, y, 0.01);  // warm-up: kernel plans, buffers
  world.barrier();
  auto t0 = std::chrono::steady_clock::now();
  double bubble = 0, sched = 0;
  std::vector<ChunkTime> cost(static_cast<std::size_t>(L.chunks));
  for (int s = 0; s < steps; ++s) {
    const StepTiming t = train_step(grid, pm, x, y, 0.01).timing;
    bubble += t.bubble();
    sched += t.schedule_s / steps;
    for (int c = 0; c < L.chunks; ++c) {
      cost[c].add(t.chunks[c], 1.0 / steps);
    }
  }
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  allreduce(&dt, &dt, 1, DType::f64, ReduceOp::max, world);
  allreduce(&bubble, &bubble, 1, DType::f64, ReduceOp::sum, world);
  allreduce(&sched, &sched, 1, DType::f64, ReduceOp::max, world);
  Result r{static_cast<double>(global) * steps / dt, bubble / steps / world.size(), 1e3 * sched, 0, {}};
  const SimCosts c = pm.executor->gather_costs(cost);
  r.predicted_ms = 1e3 * simulate(pm.executor->table(), c).makespan;
  for (const StageCost& sc : c.stage) r.costs.push_back({1e3 * sc.f, 1e3 * sc.i, 1e3 * sc.w});
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Communicator world = Communicator::world();
  CLI::App app("pipeline vs data-parallel throughput (mpirun -np 2)");
  std::int64_t batch = 128;
  int m = 8, steps = 8;
  std::string csv;
  app.add_option("--batch", batch, "global batch per step");
  app.add_option("--m", m, "micro-batches for the pipeline");
  app.add_option("--steps", steps, "timed steps per configuration");
  app.add_option("--csv", csv, "write the results here");
  CLI11_PARSE(app, argc, argv);
  omp_set_num_threads(1);
  const int w = world.size();
  Result dp = measure(world, 1, 1, batch, steps, ScheduleKind::one_f_one_b);
  std::vector<std::pair<ScheduleKind, Result>> rows;
  for (ScheduleKind k : {ScheduleKind::one_f_one_b, ScheduleKind::zb_h1, ScheduleKind::interleaved, ScheduleKind::zb_v})
    if (k != ScheduleKind::interleaved || m % w == 0) rows.push_back({k, measure(world, w, m, batch, steps, k)});
  if (world.rank() == 0) {
    const double bound = double(m) / (m + w - 1);
    std::printf("resnet-20, 32x32x3, global batch %lld, %d ranks (1 compute thread each), m = %d; bound = m/(m+p-1) "
                "x DP = %.3f x DP\n", static_cast<long long>(batch), w, m, bound);
    std::printf("%-22s %10s %7s %9s %8s %10s %10s %9s  %s\n", "configuration", "images/s", "vs DP", "vs bound",
                "x 1f1b", "sched ms", "pred ms", "meas/pred", "per stage F/I/W ms per micro-batch");
    std::printf("%-22s %10.1f %7.2f\n", cat("data parallel (DP ", w, ")").c_str(), dp.images_per_s, 1.0);
    std::ofstream o;
    if (!csv.empty()) {
      o.open(csv);
      o << "config,images_per_s,ratio_vs_dp,ratio_vs_bound,ratio_vs_1f1b,bubble,schedule_ms,predicted_ms\n";
      o << "dp" << w << "," << dp.images_per_s << ",1,,,,,\n";
    }
    const double base = rows.front().second.images_per_s;
    for (const auto& [k, r] : rows) {
      std::string st;
      for (const StageCost& c : r.costs) st += cat(st.empty() ? "" : " | ", fixed(c.f, 1), "/", fixed(c.i, 1), "/", fixed(c.w, 1));
      std::printf("%-22s %10.1f %7.2f %9.3f %8.3f %10.1f %10.1f %9.3f  %s\n",
                  cat("pipeline ", w, ", ", schedule_name(k)).c_str(), r.images_per_s, r.images_per_s / dp.images_per_s,
                  r.images_per_s / (bound * dp.images_per_s), r.images_per_s / base, r.schedule_ms, r.predicted_ms,
                  r.schedule_ms / r.predicted_ms, st.c_str());
      if (o) o << "pp" << w << "_" << schedule_name(k) << "_m" << m << "," << r.images_per_s << ","
               << r.images_per_s / dp.images_per_s << "," << r.images_per_s / (bound * dp.images_per_s) << ","
               << r.images_per_s / base << "," << r.bubble << "," << r.schedule_ms << "," << r.predicted_ms << "\n";
    }
  }
  return 0;
}
