// Must-show: with GridConfig::deterministic (comm.deterministic on the grid
// path) two runs of the same DP x PP job end with bitwise-identical parameters
// and running statistics, although the second run's engine cycles 100x slower
// with a 4 KiB instead of a 64 MiB fusion threshold and its ranks arrive at
// different times: all of which change what a fusing engine puts into one
// buffer, hence the ring's chunk boundaries and summation order at DP >= 3
// (without deterministic mode these runs differ at DP 3 and 4; checked once
// by hand, and `fused_allreduces` > 0 shows the fusion the mode must avoid). The ring algorithm is forced: on one node `auto` picks the
// shared-memory all-reduce, whose order does not depend on fusion.
// Layouts at w ranks: DP w/2 x PP 2 (w even) and DP w x PP 1 (w >= 3).
#include <gtest/gtest.h>

#include <omp.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/nn/rng.hpp"
#include "ringtrain/parallel/parts.hpp"

namespace ringtrain {
namespace {

constexpr int kSteps = 6, kMicro = 4, kPerReplica = 8;

ModelConfig resnet() {
  ModelConfig mc;
  mc.name = "resnet";
  mc.depth = 8;
  mc.base_width = 4;
  mc.in_channels = 1;
  mc.height = mc.width = 8;
  mc.classes = 10;
  mc.seed = 3;
  return mc;
}

void replica_batch(int t, int replica, Tensor& x, Tensor& y) {
  x = Tensor::empty({kPerReplica, 1, 8, 8}, DType::f32);
  y = Tensor::empty({kPerReplica}, DType::i32);
  const auto base = static_cast<std::uint64_t>(replica) * x.numel();
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = 2.f * counter_uniform(23, static_cast<std::uint64_t>(t), base + i) - 1.f;
  for (std::int64_t i = 0; i < kPerReplica; ++i)
    y.data<std::int32_t>()[i] = static_cast<std::int32_t>((x.data<float>()[i * 64] > 0 ? 5 : 0) + (i % 5));
}

struct RunResult {
  std::vector<char> bytes;  // every parameter and buffer of this rank's stage
  std::uint64_t fused = 0;
};

RunResult run(const ProcessGrid& grid, bool slow_and_jittered) {
  GridConfig pc;
  pc.micro_batches = kMicro;
  pc.batch = kPerReplica;
  pc.deterministic = true;
  pc.engine.collective.algorithm = Algorithm::ring;
  pc.engine.cycle_time_ms = slow_and_jittered ? 10.0 : 0.1;
  // What a fusing engine would put in one buffer varies with timing; vary it on
  // purpose too (4 KiB holds a few of resnet's tensors, 64 MiB all of them).
  pc.engine.fusion_threshold = slow_and_jittered ? std::size_t{4} << 10 : std::size_t{64} << 20;
  OptimizerConfig oc;
  oc.momentum = 0.9;
  ModelParts pm = build_parts(grid, resnet(), pc, oc);
  for (int t = 0; t < kSteps; ++t) {
    if (slow_and_jittered && (t + grid.dp_rank() + grid.pp_rank()) % 2 == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(3 * (1 + grid.dp_rank() + 2 * grid.pp_rank())));
    Tensor x, y;
    replica_batch(t, grid.dp_rank(), x, y);
    train_step(grid, pm, x, y, 0.05);
  }
  RunResult r;
  auto add = [&](const Tensor& t) {
    const char* p = static_cast<const char*>(t.raw());
    r.bytes.insert(r.bytes.end(), p, p + t.nbytes());
  };
  for (std::size_t i = 0; i < (*pm.stage).arena().size(); ++i) add((*pm.stage).arena().param(i));
  for (auto& b : (*pm.stage).buffers()) add(b.tensor);
  if (pm.grad_sync->engine()) r.fused = pm.grad_sync->engine()->stats().fused_allreduces;
  return r;
}

TEST(PipelineDeterministic, TwoRunsGiveTheSameBits) {
  omp_set_num_threads(1);
  Communicator world = Communicator::world();
  const int w = world.size();
  std::vector<int> pipelines;
  if (w % 2 == 0 && w >= 4) pipelines.push_back(2);
  if (w >= 3) pipelines.push_back(1);
  if (w == 2) pipelines.push_back(1);
  if (pipelines.empty()) GTEST_SKIP() << "needs data parallelism (2+ ranks)";
  for (int p : pipelines) {
    ProcessGrid grid = ProcessGrid::make(world, {p, 1});
    const std::string what = cat("DP ", grid.dp_size(), " x PP ", p, " ", grid.tag());
    RunResult a = run(grid, false), b = run(grid, true);
    ASSERT_EQ(a.bytes.size(), b.bytes.size()) << what;
    EXPECT_EQ(std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()), 0) << what << ": the runs differ";
    EXPECT_EQ(a.fused, 0u) << what << ": deterministic mode must not fuse";
    EXPECT_EQ(b.fused, 0u) << what << ": deterministic mode must not fuse";
  }
}

}  // namespace
}  // namespace ringtrain
