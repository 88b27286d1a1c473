// Failure behaviour: mismatched shape/dtype/op on one rank (new and cached
// names) fails every rank's wait() within seconds with a message naming the
// tensor, values and ranks; stall warnings and stall shutdown; shutdown with
// outstanding handles; settings mismatch; bad submissions. Nothing may hang.
#include <mutex>

#include "engine_test_util.hpp"

using namespace ringtrain;
using namespace rt_test;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// wait() must throw; returns the message ("" if it did not throw).
std::string wait_error(Engine& eng, const Handle& h) {
  try {
    eng.wait(h);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// "ranks 0,2" / "rank 0" for every rank but `except`.
std::string others(int except) {
  std::vector<int> r;
  for (int i = 0; i < world_size(); ++i)
    if (i != except) r.push_back(i);
  std::string s = r.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(r[i]);
  }
  return s;
}

}  // namespace

TEST(EngineErrors, ShapeMismatchFailsEveryRankWithinSeconds) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Engine eng(Communicator::world(), test_options());
  int rank = world_rank();
  Tensor t = Tensor::zeros(rank == 1 ? Shape{64, 31} : Shape{128, 31});
  Tensor ok = Tensor::zeros({10});
  auto t0 = std::chrono::steady_clock::now();
  Handle h = eng.allreduce_async("fc1.weight", t);
  Handle h2 = eng.allreduce_async("fc1.bias", ok);  // unaffected by the error
  std::string msg = wait_error(eng, h);
  double s = seconds_since(t0);
  EXPECT_LT(s, 10.0);
  EXPECT_TRUE(contains(msg, "allreduce 'fc1.weight': shape mismatch: " + others(1) + " submitted [128, 31], rank 1 submitted [64, 31]"))
      << msg;
  EXPECT_NO_THROW(eng.wait(h2));
  // The engine stays usable, and the name can be submitted again.
  Tensor good = Tensor::zeros({128, 31});
  good.fill_(1.0);
  Handle h3 = eng.allreduce_async("fc1.weight", good, ReduceOp::sum);
  eng.wait(h3);
  EXPECT_EQ(good.data<float>()[5], static_cast<float>(world_size()));
  EXPECT_EQ(eng.stats().errors, 1u);
}

TEST(EngineErrors, DtypeAndOpMismatchNameValuesAndRanks) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Engine eng(Communicator::world(), test_options());
  int rank = world_rank();
  Tensor a = Tensor::zeros({16}, rank == 1 ? DType::f64 : DType::f32);
  Tensor b = Tensor::zeros({16});
  auto t0 = std::chrono::steady_clock::now();
  Handle ha = eng.allreduce_async("bn.running_mean", a);
  Handle hb = eng.allreduce_async("loss", b, rank == 1 ? ReduceOp::sum : ReduceOp::avg);
  std::string ma = wait_error(eng, ha), mb = wait_error(eng, hb);
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_TRUE(contains(ma, "allreduce 'bn.running_mean': dtype mismatch: " + others(1) +
                               " submitted float32, rank 1 submitted float64")) << ma;
  EXPECT_TRUE(contains(mb, "allreduce 'loss': op mismatch: " + others(1) + " submitted avg, rank 1 submitted sum"))
      << mb;
}

TEST(EngineErrors, ChangedShapeOfACachedNameIsCaught) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Engine eng(Communicator::world(), test_options());
  int rank = world_rank();
  Tensor t = Tensor::zeros({32, 8});
  for (int step = 0; step < 2; ++step) eng.wait(eng.allreduce_async("layer.grad", t));
  EXPECT_GE(eng.stats().cache_hits, 1u) << "the name should be cached by now";
  // Rank 1 changes the shape; the others submit the cached signature (bit only).
  Tensor u = Tensor::zeros(rank == 1 ? Shape{32, 9} : Shape{32, 8});
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = wait_error(eng, eng.allreduce_async("layer.grad", u));
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_TRUE(contains(msg, "allreduce 'layer.grad': shape mismatch: " + others(1) + " submitted [32, 8], rank 1 submitted [32, 9]"))
      << msg;
  // After the error the name renegotiates and works again.
  Tensor v = Tensor::zeros({32, 8});
  v.fill_(2.0);
  eng.wait(eng.allreduce_async("layer.grad", v));
  EXPECT_EQ(v.data<float>()[0], 2.0f);
}

TEST(EngineErrors, StallWarningNamesTheMissingRankThenCompletes) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  int rank = world_rank(), last = world_size() - 1;
  std::mutex mu;
  std::vector<std::string> warnings;
  EngineOptions o = test_options();
  o.stall_warning_s = 0.3;
  o.on_stall_warning = [&](const std::string& w) {
    std::lock_guard lk(mu);
    warnings.push_back(w);
  };
  Engine eng(Communicator::world(), o);
  Tensor t = Tensor::zeros({100});
  t.fill_(1.0);
  Handle h;
  if (rank != last) h = eng.allreduce_async("late.tensor", t, ReduceOp::sum);
  // Wait (on every rank) until the warning has arrived, at most 5 s.
  auto t0 = std::chrono::steady_clock::now();
  while (eng.stats().stall_warnings == 0 && seconds_since(t0) < 5) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (rank == last) h = eng.allreduce_async("late.tensor", t, ReduceOp::sum);
  eng.wait(h);
  EXPECT_EQ(t.data<float>()[0], static_cast<float>(world_size())) << "the late tensor still completes";
  std::lock_guard lk(mu);
  ASSERT_FALSE(warnings.empty()) << "no stall warning within 5 s";
  EXPECT_TRUE(contains(warnings[0], "'late.tensor'")) << warnings[0];
  EXPECT_TRUE(contains(warnings[0], "submitted by " + others(last) + " but not by rank " + std::to_string(last)))
      << warnings[0];
}

TEST(EngineErrors, StallShutdownFailsEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  int rank = world_rank(), last = world_size() - 1;
  EngineOptions o = test_options();
  o.stall_warning_s = 0.5;
  o.stall_shutdown_s = 1.5;
  Engine eng(Communicator::world(), o);
  Tensor t = Tensor::zeros({100});
  // The last rank submits a name nobody else does; the others one it never does.
  Handle h = eng.allreduce_async(rank == last ? "only.on.last" : "never.on.last", t);
  Handle done = eng.allreduce_async("everywhere", Tensor::zeros({4}));
  eng.wait(done);
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = wait_error(eng, h);
  double s = seconds_since(t0);
  EXPECT_LT(s, 10.0);
  EXPECT_TRUE(contains(msg, "stall shutdown")) << msg;
  EXPECT_TRUE(contains(msg, "comm.stall_shutdown_s")) << msg;
  EXPECT_GE(eng.stats().stall_warnings, 1u);
  EXPECT_FALSE(eng.running());
  EXPECT_THROW(eng.allreduce_async("after", Tensor::zeros({1})), Error);
}

TEST(EngineErrors, ShutdownWithOutstandingHandlesFailsThemCleanly) {
  Engine eng(Communicator::world(), test_options());
  int rank = world_rank();
  Tensor t = Tensor::zeros({10});
  Handle h;
  // With 2+ ranks only rank 0 submits (never completes); alone, a name that is
  // queued right before shutdown may or may not complete: both are clean.
  // (A peer's shutdown may already have stopped this engine: then the
  // submission itself throws, naming the engine's state.)
  bool submitted = false;
  if (rank == 0) {
    try {
      h = eng.allreduce_async("orphan", t);
      submitted = true;
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "shut down")) << e.what();
    }
  }
  eng.shutdown();
  EXPECT_FALSE(eng.running());
  if (submitted && world_size() > 1) {
    ASSERT_TRUE(eng.poll(h));
    std::string msg = wait_error(eng, h);
    EXPECT_TRUE(contains(msg, "allreduce 'orphan' did not complete")) << msg;
    EXPECT_TRUE(contains(msg, "shut down")) << msg;
  }
  try {
    eng.allreduce_async("late", t);
    ADD_FAILURE() << "submitting after shutdown must throw";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "'late'")) << e.what();
  }
  eng.shutdown();  // idempotent
}

TEST(EngineErrors, DestructorWithUnwaitedHandlesDoesNotHang) {
  auto t0 = std::chrono::steady_clock::now();
  {
    Engine eng(Communicator::world(), test_options());
    std::vector<Tensor> ts;
    // A peer that is done first destroys its engine, which stops this one:
    // a later submission then throws (naming the tensor), which is fine here.
    try {
      for (int i = 0; i < 20; ++i) {
        ts.push_back(Tensor::zeros({1000}));
        eng.allreduce_async(cat("x", i), ts.back());
      }
      if (world_rank() == 0) eng.allreduce_async("only.rank0", Tensor::zeros({5}));
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "shut down")) << e.what();
    }
  }
  EXPECT_LT(seconds_since(t0), 10.0);
}

TEST(EngineErrors, SettingsMustAgreeAcrossRanks) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  EngineOptions o = test_options();
  if (world_rank() == 1) o.fusion_threshold = 1234;
  try {
    Engine eng(Communicator::world(), o);
    ADD_FAILURE() << "different fusion thresholds must be an error on every rank";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "fusion_threshold")) << e.what();
    EXPECT_TRUE(contains(e.what(), "1234")) << e.what();
  }
}

TEST(EngineErrors, BadSubmissionsThrowNamingTheTensor) {
  Engine eng(Communicator::world(), test_options());
  Tensor t = Tensor::zeros({8});
  EXPECT_THROW(eng.allreduce_async("", t), Error);
  EXPECT_THROW(eng.allreduce_async("undef", Tensor{}), Error);
  try {
    eng.allreduce_async("oop", t, Tensor::zeros({9}));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "'oop'")) << e.what();
  }
  // One name in flight once per rank.
  Handle h = eng.allreduce_async("dup", t);
  try {
    eng.allreduce_async("dup", Tensor::zeros({8}));
    ADD_FAILURE() << "a name already in flight must be refused";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "'dup'") && contains(e.what(), "already in flight")) << e.what();
  }
  eng.wait(h);
  EXPECT_NO_THROW(eng.wait(eng.allreduce_async("dup", t)));
  EXPECT_THROW(eng.wait(Handle{}), Error);
}

TEST(EngineErrors, SynchronizeReportsUnobservedFailures) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Engine eng(Communicator::world(), test_options());
  Tensor t = Tensor::zeros({world_rank() == 1 ? 3 : 4});
  eng.allreduce_async("mismatch.sync", t);
  try {
    eng.synchronize();
    ADD_FAILURE() << "synchronize must report the failed tensor";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "'mismatch.sync'")) << e.what();
  }
  EXPECT_NO_THROW(eng.synchronize()) << "a failure is reported once";
}

TEST(EngineErrors, StallOfACachedNameIsReportedWithTheMissingRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  int rank = world_rank(), last = world_size() - 1;
  std::mutex mu;
  std::vector<std::string> warnings;
  EngineOptions o = test_options();
  o.stall_warning_s = 0.3;
  o.on_stall_warning = [&](const std::string& w) {
    std::lock_guard lk(mu);
    warnings.push_back(w);
  };
  Engine eng(Communicator::world(), o);
  Tensor t = Tensor::zeros({50});
  for (int i = 0; i < 2; ++i) eng.wait(eng.allreduce_async("cached.grad", t));  // negotiated, then cached
  auto hits = eng.stats().cache_hits;
  Handle h;
  if (rank != last) h = eng.allreduce_async("cached.grad", t);  // only a cache bit on these ranks
  auto t0 = std::chrono::steady_clock::now();
  while (eng.stats().stall_warnings == 0 && seconds_since(t0) < 5) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (rank == last) h = eng.allreduce_async("cached.grad", t);
  eng.wait(h);
  EXPECT_EQ(eng.stats().cache_hits, hits + 1) << "the late tensor completes through the cache";
  std::lock_guard lk(mu);
  ASSERT_FALSE(warnings.empty()) << "no stall warning within 5 s";
  EXPECT_TRUE(contains(warnings[0], "'cached.grad' was submitted by " + others(last) + " but not by rank " +
                                        std::to_string(last)))
      << warnings[0];
}
