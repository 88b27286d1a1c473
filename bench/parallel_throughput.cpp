// Throughput at 2 ranks, real layers: `resnet` as a 2-stage pipeline (1F1B
// and ZB-H1, m micro-batches, one replica) next to pure data parallelism over
// the same 2 ranks (each rank the whole model, half the batch, gradients
// averaged by the fusion engine), same global batch, in one run. The DP
// reference runs through the same parts with one stage (p = 1, m = 1), which is
// the trainer's own step for data parallelism (one trainer runs every layout
// through the same parts), not a stand-in for it.
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

using namespace ringtrain;

namespace {

struct Result {
  double images_per_s = 0, bubble = 0;
};

Result measure(const Communicator& world, int p, int m, std::int64_t global, int steps, ScheduleKind kind) {
  ProcessGrid grid = ProcessGrid::make(world, {p, 1});
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
  double bubble = 0;
  for (int s = 0; s < steps; ++s) bubble += train_step(grid, pm, x, y, 0.01).timing.bubble();
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  allreduce(&dt, &dt, 1, DType::f64, ReduceOp::max, world);
  allreduce(&bubble, &bubble, 1, DType::f64, ReduceOp::sum, world);
  return {static_cast<double>(global) * steps / dt, bubble / steps / world.size()};
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
  Result p1 = measure(world, w, m, batch, steps, ScheduleKind::one_f_one_b);
  Result pz = measure(world, w, m, batch, steps, ScheduleKind::zb_h1);
  if (world.rank() == 0) {
    std::printf("resnet-20, 32x32x3, global batch %lld, %d ranks (1 compute thread each)\n",
                static_cast<long long>(batch), w);
    std::printf("%-28s %12s %10s %12s\n", "configuration", "images/s", "vs DP", "bubble");
    std::printf("%-28s %12.1f %10.2f %12s\n", "data parallel (DP 2)", dp.images_per_s, 1.0, "-");
    std::printf("%-28s %12.1f %10.2f %12.3f\n", cat("pipeline 2, 1f1b, m ", m).c_str(), p1.images_per_s,
                p1.images_per_s / dp.images_per_s, p1.bubble);
    std::printf("%-28s %12.1f %10.2f %12.3f\n", cat("pipeline 2, zb-h1, m ", m).c_str(), pz.images_per_s,
                pz.images_per_s / dp.images_per_s, pz.bubble);
    if (!csv.empty()) {
      std::ofstream o(csv);
      o << "config,images_per_s,ratio_vs_dp,bubble\n";
      o << "dp" << w << "," << dp.images_per_s << ",1,\n";
      o << "pp" << w << "_1f1b_m" << m << "," << p1.images_per_s << "," << p1.images_per_s / dp.images_per_s << "," << p1.bubble << "\n";
      o << "pp" << w << "_zbh1_m" << m << "," << pz.images_per_s << "," << pz.images_per_s / dp.images_per_s << "," << pz.bubble << "\n";
    }
  }
  return 0;
}
