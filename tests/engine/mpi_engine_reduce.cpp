// Engine results against MPI_Allreduce: many tensors of mixed sizes and dtypes
// submitted in a different order on every rank, avg and sum, fused and not,
// the response cache in steady state, out-of-place, min/max and fp16
// compression.
#include <algorithm>
#include <random>

#include "engine_test_util.hpp"

using namespace ringtrain;
using namespace rt_test;

namespace {

struct Case {
  std::string name;
  Shape shape;
  DType dtype;
};

std::vector<Case> mixed_cases() {
  std::vector<Case> cs;
  const DType dts[] = {DType::f32, DType::f64, DType::i32, DType::f16, DType::bf16, DType::i64};
  const std::int64_t sizes[] = {1, 3, 64, 1000, 4097, 25000, 70001};
  int k = 0;
  for (auto n : sizes)
    for (auto dt : dts) {
      if (dt != DType::f32 && n > 25000) continue;
      cs.push_back({cat("layer", k, ".", dtype_name(dt)), {n}, dt});
      ++k;
    }
  cs.push_back({"conv.weight", {16, 3, 3, 3}, DType::f32});
  cs.push_back({"empty", {0}, DType::f32});
  return cs;
}

// Submits every case in a rank-specific order, waits in yet another order, and
// checks each result against the MPI reference and across ranks.
void run_round(Engine& eng, const std::vector<Case>& cs, ReduceOp op, int round, std::vector<Tensor>* results = nullptr) {
  int rank = world_rank();
  std::vector<Tensor> in, ref;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    Tensor t = Tensor::empty(cs[i].shape, cs[i].dtype);
    fill(t, [&](std::int64_t j) { return exact_value(static_cast<int>(i) + round, rank, j); });
    ref.push_back(reference_allreduce(t, op));
    in.push_back(t);
  }
  std::vector<std::size_t> order(cs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 rng(1234 + rank * 77 + round);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<Handle> hs(cs.size());
  for (auto i : order) hs[i] = eng.allreduce_async(cs[i].name, in[i], op);
  std::shuffle(order.begin(), order.end(), rng);
  for (auto i : order) eng.wait(hs[i]);
  for (std::size_t i = 0; i < cs.size(); ++i) {
    EXPECT_TRUE(eng.poll(hs[i]));
    EXPECT_TRUE(same_bytes(in[i], ref[i])) << cs[i].name << " (" << op_name(op) << ") differs from MPI_Allreduce";
    EXPECT_TRUE(identical_across_ranks(in[i])) << cs[i].name << " not bitwise identical across ranks";
  }
  if (results) *results = in;
}

}  // namespace

TEST(EngineReduce, MixedTensorsAnyOrderAvgAndSumMatchMpi) {
  Engine eng(Communicator::world(), test_options());
  auto cs = mixed_cases();
  run_round(eng, cs, ReduceOp::avg, 0);
  // A different op makes every name renegotiate (signature changed).
  run_round(eng, cs, ReduceOp::sum, 1);
  auto s = eng.stats();
  EXPECT_EQ(s.tensors_reduced, 2 * cs.size());
  EXPECT_EQ(s.cache_misses, 2 * cs.size());
  EXPECT_LT(s.allreduces, s.tensors_reduced) << "ready tensors of one dtype should have been fused";
  EXPECT_GT(s.fused_allreduces, 0u);
  EXPECT_EQ(s.errors, 0u);
}

TEST(EngineReduce, FusionOffGivesTheSameBits) {
  auto cs = mixed_cases();
  std::vector<Tensor> fused, unfused;
  {
    Engine eng(Communicator::world(), test_options());
    run_round(eng, cs, ReduceOp::avg, 5, &fused);
  }
  EngineOptions o = test_options();
  o.fusion_threshold = 0;
  Engine eng(Communicator::world(), o);
  run_round(eng, cs, ReduceOp::avg, 5, &unfused);
  for (std::size_t i = 0; i < cs.size(); ++i) EXPECT_TRUE(same_bytes(fused[i], unfused[i])) << cs[i].name;
  auto s = eng.stats();
  EXPECT_EQ(s.allreduces, cs.size()) << "threshold 0 must issue one all-reduce per tensor";
  EXPECT_EQ(s.fused_allreduces, 0u);
}

TEST(EngineReduce, RandomDataCloseToMpiAndSmallThresholdSplitsBatches) {
  // Random floats: reduction order may differ from MPI's, so compare with a tolerance.
  EngineOptions o = test_options();
  o.fusion_threshold = 40000;  // bytes: forces several batches
  Engine eng(Communicator::world(), o);
  int rank = world_rank();
  std::mt19937 rng(99 + rank);
  std::uniform_real_distribution<float> U(-1, 1);
  std::vector<Tensor> ts, refs;
  std::vector<Handle> hs;
  for (int i = 0; i < 20; ++i) {
    Tensor t = Tensor::empty({1000 + 500 * i});
    for (std::int64_t j = 0; j < t.numel(); ++j) t.data<float>()[j] = U(rng);
    refs.push_back(reference_allreduce(t, ReduceOp::sum));
    ts.push_back(t);
  }
  for (int i = 19; i >= 0; --i) hs.push_back(eng.allreduce_async(cat("g", i), ts[i], ReduceOp::sum));
  for (auto& h : hs) eng.wait(h);
  for (int i = 0; i < 20; ++i) {
    for (std::int64_t j = 0; j < ts[i].numel(); ++j)
      ASSERT_NEAR(ts[i].data<float>()[j], refs[i].data<float>()[j], 1e-5f) << "g" << i << "[" << j << "]";
    EXPECT_TRUE(identical_across_ranks(ts[i]));
  }
  auto s = eng.stats();
  EXPECT_GT(s.allreduces, 2u);
  EXPECT_LT(s.allreduces, 20u);
}

TEST(EngineReduce, SteadyStateUsesTheResponseCache) {
  Engine eng(Communicator::world(), test_options());
  auto cs = mixed_cases();
  run_round(eng, cs, ReduceOp::avg, 0);
  auto s1 = eng.stats();
  EXPECT_EQ(s1.cache_misses, cs.size());
  EXPECT_EQ(s1.cache_hits, 0u);
  for (int round = 1; round <= 3; ++round) run_round(eng, cs, ReduceOp::avg, round);
  auto s2 = eng.stats();
  EXPECT_EQ(s2.cache_misses, cs.size()) << "no renegotiation after the first round";
  EXPECT_EQ(s2.cache_hits, 3 * cs.size());
  EXPECT_EQ(s2.negotiations, s1.negotiations) << "steady state must agree through the bit-vector only";
  EXPECT_GT(s2.cycles, s1.cycles);
}

TEST(EngineReduce, CacheDisabledAndTinyCacheStillCorrect) {
  for (std::size_t cap : {std::size_t{0}, std::size_t{3}}) {
    EngineOptions o = test_options();
    o.cache_capacity = cap;
    Engine eng(Communicator::world(), o);
    auto cs = mixed_cases();
    for (int round = 0; round < 3; ++round) run_round(eng, cs, ReduceOp::avg, round);
    auto s = eng.stats();
    EXPECT_EQ(s.cache_hits + s.cache_misses, 3 * cs.size()) << "capacity " << cap;
    if (cap == 0) {
      EXPECT_EQ(s.cache_hits, 0u);
    }
  }
}

TEST(EngineReduce, OutOfPlaceMinMax) {
  Engine eng(Communicator::world(), test_options());
  int rank = world_rank();
  for (ReduceOp op : {ReduceOp::min, ReduceOp::max, ReduceOp::sum}) {
    Tensor in = Tensor::empty({513}, DType::f32), out = Tensor::zeros({513}, DType::f32);
    fill(in, [&](std::int64_t j) { return exact_value(3, rank, j); });
    Tensor before = in.clone();
    Tensor ref = reference_allreduce(in, op);
    auto h = eng.allreduce_async(cat("oop.", op_name(op)), in, out, op);
    eng.wait(h);
    EXPECT_TRUE(same_bytes(out, ref)) << op_name(op);
    EXPECT_TRUE(same_bytes(in, before)) << "out-of-place must not modify the input";
  }
}

TEST(EngineReduce, Fp16CompressionWithinFp16Tolerance) {
  EngineOptions o = test_options();
  o.fp16_allreduce = true;
  Engine eng(Communicator::world(), o);
  int rank = world_rank(), size = world_size();
  std::mt19937 rng(7 + rank);
  std::uniform_real_distribution<float> U(-2, 2);
  std::vector<Tensor> ts, refs;
  std::vector<Handle> hs;
  std::size_t bytes = 0;
  for (int i = 0; i < 8; ++i) {
    Tensor t = Tensor::empty({777 * (i + 1)});
    for (std::int64_t j = 0; j < t.numel(); ++j) t.data<float>()[j] = U(rng);
    refs.push_back(reference_allreduce(t, ReduceOp::avg));
    ts.push_back(t);
    bytes += t.numel() * 2;
  }
  Tensor ints = Tensor::empty({100}, DType::i32);  // not compressed: exact
  fill(ints, [&](std::int64_t j) { return exact_value(1, rank, j); });
  Tensor iref = reference_allreduce(ints, ReduceOp::sum);
  for (int i = 0; i < 8; ++i) hs.push_back(eng.allreduce_async(cat("w", i), ts[i]));
  hs.push_back(eng.allreduce_async("ints", ints, ReduceOp::sum));
  for (auto& h : hs) eng.wait(h);
  // Each rank's value (|x| < 2) is rounded to fp16 (abs error <= 2^-10), and
  // each of the size-1 combine steps rounds a partial sum |s| < 2*size
  // (error <= size * 2^-10); the average divides the total by size.
  double tol = (size * std::ldexp(1.0, -10) + (size - 1) * size * std::ldexp(1.0, -10)) / size + 1e-6;
  double worst = 0;
  bool quantised = false;
  for (int i = 0; i < 8; ++i) {
    for (std::int64_t j = 0; j < ts[i].numel(); ++j) {
      double d = std::abs(ts[i].data<float>()[j] - refs[i].data<float>()[j]);
      worst = std::max(worst, d);
      quantised = quantised || d > 0;
    }
    EXPECT_TRUE(identical_across_ranks(ts[i]));
  }
  EXPECT_LE(worst, tol);
  EXPECT_TRUE(quantised) << "fp16 compression should lose some precision vs float32";
  EXPECT_TRUE(same_bytes(ints, iref));
  EXPECT_EQ(eng.stats().bytes_reduced, bytes + 100 * 4) << "float32 should travel as 2 bytes per element";
}

TEST(EngineReduce, SynchronizeWaitsForEverythingAndCountsWaitTime) {
  Engine eng(Communicator::world(), test_options());
  std::vector<Tensor> ts;
  std::vector<Handle> hs;
  for (int i = 0; i < 30; ++i) {
    ts.push_back(Tensor::empty({100 + i}));
    fill(ts.back(), [&](std::int64_t j) { return exact_value(i, world_rank(), j); });
    hs.push_back(eng.allreduce_async(cat("s", i), ts.back(), ReduceOp::sum));
  }
  eng.synchronize();
  for (auto& h : hs) EXPECT_TRUE(eng.poll(h));
  auto s = eng.stats();
  EXPECT_EQ(s.tensors_reduced, 30u);
  EXPECT_GE(s.waits, 1u);
  EXPECT_GT(s.wait_seconds, 0.0);
  EXPECT_GT(s.bytes_reduced, 0u);
  EXPECT_GT(s.allreduce_seconds, 0.0);
}

TEST(EngineReduce, EngineTrafficNeverMatchesTheCallersCollectives) {
  // Two engines and the main thread's own collectives on the same world
  // communicator, all at once: each engine works on a private duplicate.
  auto world = Communicator::world();
  Engine a(world, test_options()), b(world, test_options());
  int rank = world_rank();
  std::vector<Tensor> ta, tb, ra, rb;
  std::vector<Handle> ha, hb;
  for (int i = 0; i < 10; ++i) {
    ta.push_back(Tensor::empty({2000 + i}));
    tb.push_back(Tensor::empty({2000 + i}));
    fill(ta.back(), [&](std::int64_t j) { return exact_value(i, rank, j); });
    fill(tb.back(), [&](std::int64_t j) { return exact_value(i + 50, rank, j); });
    ra.push_back(reference_allreduce(ta.back(), ReduceOp::sum));
    rb.push_back(reference_allreduce(tb.back(), ReduceOp::avg));
  }
  for (int i = 0; i < 10; ++i) {
    ha.push_back(a.allreduce_async(cat("t", i), ta[i], ReduceOp::sum));  // same names in both engines
    hb.push_back(b.allreduce_async(cat("t", i), tb[i], ReduceOp::avg));
  }
  Tensor mine = Tensor::empty({333});
  fill(mine, [&](std::int64_t j) { return exact_value(99, rank, j); });
  Tensor ref = reference_allreduce(mine, ReduceOp::sum);
  allreduce(mine.raw(), mine.raw(), 333, DType::f32, ReduceOp::sum, world, test_options().collective);
  EXPECT_TRUE(same_bytes(mine, ref));
  for (int i = 0; i < 10; ++i) {
    a.wait(ha[i]);
    b.wait(hb[i]);
    EXPECT_TRUE(same_bytes(ta[i], ra[i])) << i;
    EXPECT_TRUE(same_bytes(tb[i], rb[i])) << i;
  }
  EXPECT_THROW(a.wait(hb[0]), Error) << "a handle belongs to the engine that issued it";
}

TEST(EngineReduce, IdleEngineBacksOffAndWakesOnSubmission) {
  Engine eng(Communicator::world(), test_options());
  Tensor t = Tensor::zeros({64});
  eng.wait(eng.allreduce_async("warm", t));
  MPI_Barrier(MPI_COMM_WORLD);
  auto c0 = eng.stats().cycles;
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto idle_cycles = eng.stats().cycles - c0;
  // 400 ms at a 1 ms cycle would be ~400 cycles without the back-off (32 ms pauses).
  EXPECT_LT(idle_cycles, 120u) << "idle engine should back off";
  EXPECT_GT(idle_cycles, 5u);
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = std::chrono::steady_clock::now();
  t.fill_(1.0);
  eng.wait(eng.allreduce_async("warm", t, ReduceOp::sum));
  EXPECT_LT(seconds_since(t0), 0.5) << "a submission must end the idle pause";
  EXPECT_EQ(t.data<float>()[0], static_cast<float>(world_size()));
}
