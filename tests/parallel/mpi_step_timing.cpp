// The step-time split that bench_parallel_layouts reports, checked against
// what is known independently:
//  - TpStats counts a vit step's tensor-parallel all-reduces exactly as
//    Megatron's structure says (2 forward + 2 backward per block and
//    micro-batch, each of B·S·D floats), and its seconds hold the time a rank
//    waits in them (a tensor peer that starts late by a known sleep);
//  - StepTiming.reduce_s holds the time a replica waits for the data-parallel
//    gradient all-reduce (a replica that starts late by a known sleep), kept
//    out of busy_s.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "ringtrain/nn/rng.hpp"
#include "ringtrain/parallel/parts.hpp"

namespace ringtrain {
namespace {

constexpr double kLate = 0.5;   // seconds a peer starts its step late
constexpr double kSkew = 0.15;  // slack for barrier exit skew and scheduling on a loaded machine
constexpr int kDepth = 2, kM = 2;
constexpr std::int64_t kWidth = 24, kHeads = 12, kPatch = 7, kBatch = 8;  // 12 heads of 2: T = 1..4 divide them

ModelConfig small_vit() {
  ModelConfig mc;
  mc.name = "vit";
  mc.base_width = kWidth;
  mc.heads = kHeads;
  mc.depth = kDepth;
  mc.patch = kPatch;
  mc.mlp_ratio = 2.0;
  return mc;
}

GridConfig pipe_cfg() {
  GridConfig pc;
  pc.micro_batches = kM;
  pc.batch = kBatch;
  return pc;
}

std::pair<Tensor, Tensor> batch(std::uint64_t stream) {
  Tensor x = Tensor::empty({kBatch, 1, 28, 28}), y = Tensor::empty({kBatch}, DType::i64);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = counter_uniform(5, stream, i) - 0.5f;
  for (std::int64_t i = 0; i < kBatch; ++i) y.data<std::int64_t>()[i] = i % 10;
  return {x, y};
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

TEST(StepTiming, TpStatsCountTheBlocksAllReducesAndTheirWait) {
  Communicator world = Communicator::world();
  const int T = world.size();
  if (kHeads % T != 0) GTEST_SKIP() << T << " ranks: the " << kHeads << " heads do not split " << T << " ways";
  ProcessGrid grid = ProcessGrid::make(world, {1, T});
  auto stats = std::make_shared<TpStats>();
  ModelConfig mc = small_vit();
  mc.tensor.stats = stats;
  mc.sequence = false;  // the block's two all-reduces each way (sequence parallelism turns them into gathers/scatters)
  ModelParts pm = build_parts(grid, mc, pipe_cfg(), OptimizerConfig{});
  auto [x, y] = batch(grid.dp_rank());
  train_step(grid, pm, x, y, 0.01);  // first-step allocations
  world.barrier();
  stats->reset();
  if (grid.tp_rank() != 0) sleep_s(kLate);
  StepResult r = train_step(grid, pm, x, y, 0.01);
  if (T == 1) {  // no tensor group: the collectives return before counting; nothing to time
    EXPECT_EQ(stats->calls, 0);
    GTEST_SKIP() << "1 rank: no tensor-parallel all-reduces to count or time (checked that none was counted)";
  }
  const std::int64_t S = (28 / kPatch) * (28 / kPatch), msg = (kBatch / kM) * S * kWidth * 4;
  EXPECT_EQ(stats->calls, 4 * kDepth * kM);
  EXPECT_DOUBLE_EQ(stats->bytes, double(4 * kDepth * kM * msg));
  EXPECT_LE(stats->seconds, r.timing.busy_s);  // the collectives run inside the timed ops
  // Rank 0 computes up to the first all-reduce, then waits there for the late peer.
  if (grid.tp_rank() == 0) {
    EXPECT_GE(stats->seconds, kLate - (r.timing.busy_s - stats->seconds) - kSkew);
  }
}

TEST(StepTiming, ReduceWaitHoldsTheDataParallelWaitOutsideBusy) {
  Communicator world = Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 data-parallel replicas";
  ProcessGrid grid = ProcessGrid::make(world, {1, 1});
  ModelParts pm = build_parts(grid, small_vit(), pipe_cfg(), OptimizerConfig{});
  auto [x, y] = batch(grid.dp_rank());
  train_step(grid, pm, x, y, 0.01);
  world.barrier();
  if (grid.dp_rank() != 0) sleep_s(kLate);
  StepResult r = train_step(grid, pm, x, y, 0.01);
  const StepTiming& t = r.timing;
  EXPECT_LE(t.busy_s + t.reduce_s, t.wall_s + 1e-6);
  if (grid.dp_rank() == 0) {
    EXPECT_GE(t.reduce_s, kLate - t.busy_s - kSkew);  // rank 0's gradients wait for the late replica's
  }
}

}  // namespace
}  // namespace ringtrain
