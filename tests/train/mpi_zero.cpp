// ZeRO-1, 2 and 3 (parallel.zero = 1, 2, 3): optimizer state (and gradients,
// and parameters) sharded over the data-parallel ranks.
//  - The sharded run (ZeRO-1, 2 and 3) follows the unsharded run of the same data and seed: after
//    50 steps every parameter agrees within 1e-6 (relative to its largest
//    element) for mlp and cnn with Adam, SGD momentum, LAMB and LARS (the last
//    two need whole-parameter norms, all-reduced over a parameter's pieces),
//    with gradient clipping, fp16 loss scaling and (AdamW) gradient accumulation.
//    On one node the results are in fact bitwise equal (shm_reduce_scatter): measured
//    difference 0 for ZeRO-1, 2 and 3 at 1-4 ranks (AMD EPYC, one node).
//  - Each rank holds 1/ranks of the unsharded optimizer state (measured against
//    an unsharded optimizer of the same model).
//  - Checkpoints (ZeRO-1 and ZeRO-3): written sharded and loaded unsharded (and the reverse), then
//    written again, they are bitwise the same file contents; a run continued
//    across the switch ends where the unswitched run ends.
//  - The optimizer alone: shm, ring and MPI reduce-scatters against the whole
//    optimizer on exact gradients; empty slices and two dtypes; gather/scatter;
//    shm_reduce_scatter bitwise the shm all-reduce's blocks.
//  - Bad input: the old key parallel.shard_optimizer, a non-integer value and
//    parallel.zero = 4 are errors naming the key; every layout accepts 1 to 3.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "fixtures.hpp"
#include "ringtrain/comm/shm.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/optim/optimizer.hpp"
#include "ringtrain/optim/sharded_optimizer.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/trainer.hpp"
#include "support/error_of.hpp"

using namespace ringtrain;
using test_support::error_of;
namespace fs = std::filesystem;

namespace {

struct Case {
  const char* model;
  const char* optimizer;
  double lr;
  double clip = 0.0;
  const char* precision = "fp32";
  int accumulation = 1;
};

std::string data_dir(const Communicator& world) {
  static std::string dir = test_fixtures::synthetic_mnist_like(world, "zero", 512, 64);
  return dir;
}

TrainConfig config(const Communicator& world, const Case& k, int zero, int steps) {
  TrainConfig c = test_fixtures::small_config(data_dir(world));
  c.model.name = k.model;
  c.data.batch_size = 8;
  c.train.epochs = 100;
  c.train.max_steps = steps;
  c.train.precision = k.precision;
  c.train.accumulation = k.accumulation;
  c.optimizer.name = k.optimizer;
  c.optimizer.lr = k.lr;
  c.optimizer.momentum = 0.9;
  c.optimizer.weight_decay = 1e-2;  // LARS/LAMB: the trust ratio applies
  c.optimizer.clip_norm = k.clip;
  c.schedule.name = "constant";
  c.parallel.zero = zero;
  return c;
}

TrainerHooks quiet() { return test_fixtures::quiet_hooks(); }

// Every parameter, copied out of the trainer's arena.
std::vector<std::pair<std::string, std::vector<float>>> params_of(Trainer& t) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  const ParamArena& a = t.parameters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    Tensor p = a.param(i);
    out.emplace_back(a.info(i).name, std::vector<float>(p.data<float>(), p.data<float>() + p.numel()));
  }
  return out;
}

// max over parameters of max|a - b| / max|b|.
double worst_relative(const std::vector<std::pair<std::string, std::vector<float>>>& a,
                      const std::vector<std::pair<std::string, std::vector<float>>>& b, std::string* where) {
  double worst = 0;
  EXPECT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    double diff = 0, scale = 1e-30;
    for (std::size_t j = 0; j < a[i].second.size(); ++j) {
      diff = std::max(diff, std::abs(double(a[i].second[j]) - double(b[i].second[j])));
      scale = std::max(scale, std::abs(double(b[i].second[j])));
    }
    if (diff / scale > worst) {
      worst = diff / scale;
      *where = a[i].first;
    }
  }
  return worst;
}

std::vector<std::pair<std::string, std::vector<float>>> train(const Communicator& world, const TrainConfig& c,
                                                              std::size_t* state_bytes = nullptr) {
  Trainer t(c, world, quiet());
  t.fit();
  if (state_bytes) *state_bytes = t.memory().optimizer;
  return params_of(t);
}

class ZeroEquals : public ::testing::TestWithParam<Case> {};

TEST_P(ZeroEquals, UnshardedAfter50Steps) {
  Communicator world = Communicator::world();
  const Case k = GetParam();
  std::size_t whole = 0, slice = 0;
  auto ref = train(world, config(world, k, false, 50), &whole);
  std::string where;
  double worst = 0;
  for (int zero : {1, 2, 3}) {
    auto got = train(world, config(world, k, zero, 50), &slice);
    // The sharded trainer holds its slice of the state: total/ranks, up to the
    // 64-byte alignment of the slice boundaries (per state kind), plus the step counter.
    const double even = double(whole - 8) / world.size() + 8;
    EXPECT_NEAR(double(slice), even, 2.0 * 64 * world.size()) << "ZeRO-" << zero << " state bytes on rank "
                                                               << world.rank();
    std::string at;
    const double w = worst_relative(got, ref, &at);
    EXPECT_LE(w, 1e-6) << "ZeRO-" << zero << " " << k.model << "/" << k.optimizer << ": parameter " << at
                       << " differs by " << w;
    if (w >= worst) worst = w, where = at;
  }
  // The run moved the parameters (the comparison is not between two initialisations).
  TrainConfig none = config(world, k, false, 50);
  none.train.max_steps = 0;
  none.train.epochs = 1;
  Trainer init(none, world, quiet());
  std::string w2;
  EXPECT_GT(worst_relative(params_of(init), ref, &w2), 1e-3);
  if (world.rank() == 0)
    std::printf("%s/%s%s: worst relative parameter difference (ZeRO-1, 2, 3) after 50 steps %.3g (%s)\n", k.model, k.optimizer,
                k.clip > 0 ? " clip" : "", worst, where.c_str());
}

INSTANTIATE_TEST_SUITE_P(Models, ZeroEquals,
                         ::testing::Values(Case{"mlp", "adam", 1e-3}, Case{"mlp", "sgd", 0.02},
                                           Case{"cnn", "adam", 1e-3}, Case{"cnn", "sgd", 0.02},
                                           Case{"mlp", "lamb", 1e-3}, Case{"mlp", "lars", 0.05},
                                           Case{"cnn", "sgd", 0.02, 0.5}, Case{"mlp", "adam", 1e-3, 0.0, "fp16"},
                                           Case{"mlp", "adamw", 1e-3, 0.0, "fp32", 2}),
                         [](const auto& info) {
                           const Case& k = info.param;
                           return std::string(k.model) + "_" + k.optimizer + (k.clip > 0 ? "_clip" : "") +
                                  (std::string(k.precision) == "fp32" ? "" : std::string("_") + k.precision) +
                                  (k.accumulation > 1 ? "_accumulation" : "");
                         });

// Each rank's state is its slice: 1/ranks of what the unsharded optimizer holds.
TEST(Zero, OptimizerStateBytesPerRankAreTotalOverRanks) {
  Communicator world = Communicator::world();
  for (const char* name : {"cnn", "mlp"}) {
    ModelConfig mc;
    mc.name = name;
    Stage model(mc, Device::cpu());
    OptimizerConfig oc;
    oc.name = "adam";
    std::size_t total = 0;
    for (const auto& [n, t] : make_optimizer(model.arena(), oc)->state()) total += t.nbytes();
    ShardedOptimizer z(model.arena(), oc, world);
    const auto [most, unsharded] = z.state_bytes_summary();
    EXPECT_EQ(unsharded, total) << name;
    // Two fp32 moments; a slice boundary moves by at most one 64-byte unit per rank.
    const double even = double(total - 8) / world.size() + 8;
    const double slack = 2.0 * 64 * world.size();
    EXPECT_NEAR(double(z.state_bytes()), even, slack) << name << " on rank " << world.rank();
    EXPECT_NEAR(double(most), even, slack) << name;
    if (world.rank() == 0)
      std::printf("%s adam state: %zu bytes unsharded, %zu bytes per rank (largest) at %d rank(s)\n", name, total,
                  most, world.size());
  }
}

// Rank r's gradient of element j: a multiple of 2^-12 below 2^4, so sums over
// ranks are exact in any order; the reference averages them locally.
float exact_grad(int rank, std::int64_t j, int step) {
  return float(((j * 7 + rank * 13 + step * 5) % 61) - 30) / 4096.0f;
}

// The ShardedOptimizer alone, on every collective path (shm on one node, our
// ring, MPI's), against the whole optimizer fed the same averaged gradients:
// SGD and Adam bitwise, LAMB and LARS (norms summed over pieces in another
// order) within 1e-6.
TEST(Zero, ShardedOptimizerEqualsWholeOnEveryAlgorithm) {
  Communicator world = Communicator::world();
  ModelConfig mc;
  mc.name = "mlp";
  for (const char* alg : {"auto", "ring", "mpi"})
    for (const char* name : {"sgd", "adam", "lamb", "lars"}) {
      Stage sharded(mc, Device::cpu()), whole(mc, Device::cpu());
      ParamArena& a = sharded.arena();
      ParamArena& b = whole.arena();
      OptimizerConfig oc;
      oc.name = name;
      oc.momentum = 0.9;
      oc.weight_decay = 1e-2;
      CollectiveOptions co;
      co.algorithm = parse_algorithm(alg);
      ShardedOptimizer z(a, oc, world.dup("zero-test"), co);
      auto ref = make_optimizer(b, oc);
      const std::int64_t n = a.grads_flat().numel();
      for (int step = 0; step < 5; ++step) {
        float* ga = a.grads_flat().data<float>();
        float* gb = b.grads_flat().data<float>();
        for (const ParamInfo& p : a.infos())
          for (std::int64_t j = std::int64_t(p.offset); j < std::int64_t(p.offset) + shape_numel(p.shape); ++j) {
            ga[j] = exact_grad(world.rank(), j, step);
            float sum = 0;
            for (int r = 0; r < world.size(); ++r) sum += exact_grad(r, j, step);
            gb[j] = sum * float(1.0 / world.size());  // the engine's average
          }
        z.reduce_scatter_grads();
        z.step(0.01);
        ref->step(0.01);
      }
      const float* pa = a.params_flat().data<float>();
      const float* pb = b.params_flat().data<float>();
      double worst = 0, scale = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        worst = std::max(worst, std::abs(double(pa[j]) - double(pb[j])));
        scale = std::max(scale, std::abs(double(pb[j])));
      }
      const bool elementwise = std::string(name) == "sgd" || std::string(name) == "adam";
      if (elementwise) EXPECT_EQ(worst, 0.0) << alg << "/" << name;
      else EXPECT_LE(worst / scale, 1e-6) << alg << "/" << name;
      EXPECT_EQ(z.steps(), 5);
    }
}

void expect_bitwise(const CheckpointData& a, const CheckpointData& b, const char* what) {
  EXPECT_EQ(a.scalars.at("step"), b.scalars.at("step")) << what;
  ASSERT_EQ(a.tensors.size(), b.tensors.size()) << what;
  int optim = 0;
  for (const auto& [name, t] : a.tensors) {
    auto it = std::find_if(b.tensors.begin(), b.tensors.end(), [&](const auto& p) { return p.first == name; });
    ASSERT_NE(it, b.tensors.end()) << what << ": " << name;
    ASSERT_EQ(t.nbytes(), it->second.nbytes()) << what << ": " << name;
    EXPECT_EQ(std::memcmp(t.raw(), it->second.raw(), t.nbytes()), 0) << what << ": " << name << " differs";
    optim += name.rfind("optim/", 0) == 0;
  }
  EXPECT_GT(optim, 2) << what << ": the checkpoint holds the optimizer state";
}

// Tiny arenas leave some ranks an empty slice; two dtypes give two slices per
// rank. The gathered state equals the whole optimizer's bitwise, and scattering
// it into a fresh ShardedOptimizer continues identically.
TEST(Zero, EmptySlicesTwoDtypesAndGatherScatter) {
  Communicator world = Communicator::world();
  auto make = [] {
    auto a = std::make_unique<ParamArena>();
    a->add("a", {10});
    a->add("b", {3}, DType::f32, /*decay=*/false);
    a->add("c", {5}, DType::f64);
    a->add("d", {40});
    a->finalize();
    for (DType dt : a->dtypes()) {
      Tensor p = a->params_flat(dt);
      for (std::int64_t j = 0; j < p.numel(); ++j) {
        const double v = 0.01 * double((j * 17) % 23 - 11);
        if (dt == DType::f32) p.data<float>()[j] = float(v);
        else p.data<double>()[j] = v;
      }
    }
    return a;
  };
  for (const char* name : {"adam", "lamb"}) {
    auto sa = make(), wa = make(), ra = make();
    OptimizerConfig oc;
    oc.name = name;
    oc.weight_decay = 1e-2;
    ShardedOptimizer z(*sa, oc, world.dup("zero-tiny"));
    auto ref = make_optimizer(*wa, oc);
    auto fill = [&](ParamArena& a, int step, bool averaged) {
      for (const ParamInfo& p : a.infos())
        for (std::int64_t j = 0; j < shape_numel(p.shape); ++j) {
          const std::int64_t e = std::int64_t(p.offset) + j;
          float sum = 0;
          for (int r = 0; r < world.size(); ++r) sum += exact_grad(r, e, step);
          const double g = averaged ? sum * float(1.0 / world.size()) : exact_grad(world.rank(), e, step);
          if (p.dtype == DType::f32) a.grads_flat(DType::f32).data<float>()[e] = float(g);
          else a.grads_flat(DType::f64).data<double>()[e] = averaged ? double(sum) * (1.0 / world.size()) : g;
        }
    };
    for (int step = 0; step < 3; ++step) {
      fill(*sa, step, false);
      fill(*wa, step, true);
      z.reduce_scatter_grads();
      z.step(0.01);
      ref->step(0.01);
    }
    EXPECT_EQ(z.counts(DType::f32).size(), std::size_t(world.size()));
    std::unique_ptr<Optimizer> gathered = z.gather(0);
    ASSERT_EQ(gathered != nullptr, world.rank() == 0);
    if (gathered) {
      const auto got = gathered->state(), want = ref->state();
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].first, want[i].first);
        if (std::string(name) == "adam") {  // LAMB: norms summed in another order; Adam's moments are exact
          EXPECT_EQ(std::memcmp(got[i].second.raw(), want[i].second.raw(), want[i].second.nbytes()), 0)
              << name << " state " << want[i].first;
        }
      }
    }
    // A fresh sharded optimizer takes the gathered state; both then continue alike.
    std::memcpy(ra->params_flat(DType::f32).raw(), sa->params_flat(DType::f32).raw(),
                sa->params_flat(DType::f32).nbytes());
    std::memcpy(ra->params_flat(DType::f64).raw(), sa->params_flat(DType::f64).raw(),
                sa->params_flat(DType::f64).nbytes());
    ShardedOptimizer z2(*ra, oc, world.dup("zero-tiny2"));
    z2.scatter(gathered.get(), 0);
    EXPECT_EQ(z2.steps(), 3);
    fill(*sa, 3, false);
    fill(*ra, 3, false);
    z.reduce_scatter_grads();
    z2.reduce_scatter_grads();
    z.step(0.01);
    z2.step(0.01);
    for (DType dt : sa->dtypes())
      EXPECT_EQ(std::memcmp(sa->params_flat(dt).raw(), ra->params_flat(dt).raw(), sa->params_flat(dt).nbytes()), 0)
          << name << " " << dtype_name(dt);
  }
}

// shm_reduce_scatter, over many slot-sized chunks and uneven (some empty) blocks,
// gives bitwise the blocks of shm_allreduce's result.
TEST(Zero, ShmReduceScatterIsBitwiseTheShmAllreduce) {
  Communicator world = Communicator::world();
  if (world.node_count() != 1) GTEST_SKIP() << "needs one node";
  Communicator comm = world.dup("zero-shm");
  const int p = comm.size();
  std::vector<std::size_t> counts;
  for (int r = 0; r < p; ++r) counts.push_back(r == 1 ? 0 : std::size_t(700001 + 3 * r));
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  std::vector<float> in(total), all(total);
  for (std::size_t j = 0; j < total; ++j) in[j] = std::sin(0.37f * float(j) + float(comm.rank())) / 3.0f;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    CollectiveOptions co;
    co.algorithm = Algorithm::shm;
    allreduce(in.data(), all.data(), total, DType::f32, op, comm, co);
    std::size_t lo = 0;
    for (int r = 0; r < comm.rank(); ++r) lo += counts[std::size_t(r)];
    std::vector<float> mine(counts[std::size_t(comm.rank())] + 1);
    shm_reduce_scatter(in.data(), mine.data(), counts, DType::f32, op, comm, co);
    EXPECT_EQ(std::memcmp(mine.data(), all.data() + lo, counts[std::size_t(comm.rank())] * sizeof(float)), 0)
        << op_name(op) << " on rank " << comm.rank();
  }
}

// Sharded <-> unsharded through checkpoints: load + save is the identity, and a
// run continued across the switch ends where the unswitched run ends.
TEST(Zero, CheckpointsResumeAcrossShardingBitwise) {
  Communicator world = Communicator::world();
  const Case k{"mlp", "adam", 1e-3};
  for (int sharded : {1, 3}) {  // ZeRO-1 (optimizer slices) and ZeRO-3 (parameter slices too)
    SCOPED_TRACE(cat("ZeRO-", sharded));
    const std::string root = data_dir(world) + "/ckpt";
    auto dir = [&](const char* d) { return root + "/" + d; };
    auto first = [&](bool shard, const char* d) {
      TrainConfig c = config(world, k, shard ? sharded : 0, 10);
      c.checkpoint.dir = dir(d);
      Trainer t(c, world, quiet());
      t.fit();
    };
    first(false, "u10");
    first(true, "s10");
    // Load and write again at once, the other way.
    auto reload = [&](bool shard, const char* from, const char* to) {
      TrainConfig c = config(world, k, shard ? sharded : 0, 10);
      c.checkpoint.dir = dir(to);
      Trainer t(c, world, quiet());
      t.resume(dir(from));
      t.save_checkpoint();
    };
    reload(true, "u10", "u10-as-s");
    reload(false, "s10", "s10-as-u");
    world.barrier();
    if (world.rank() == 0) {
      expect_bitwise(find_intact_checkpoint(dir("u10")).data, find_intact_checkpoint(dir("u10-as-s")).data,
                     "unsharded -> sharded -> saved");
      expect_bitwise(find_intact_checkpoint(dir("s10")).data, find_intact_checkpoint(dir("s10-as-u")).data,
                     "sharded -> unsharded -> saved");
    }
    // Continue to step 20 across the switch; the reference continues unsharded.
    auto resume20 = [&](bool shard, const char* from) {
      TrainConfig c = config(world, k, shard ? sharded : 0, 20);
      Trainer t(c, world, quiet());
      t.resume(dir(from));
      t.fit();
      return params_of(t);
    };
    auto ref = resume20(false, "u10");
    std::string where;
    double w = worst_relative(resume20(true, "u10"), ref, &where);
    EXPECT_LE(w, 1e-6) << "unsharded checkpoint continued sharded: " << where << " differs by " << w;
    w = worst_relative(resume20(false, "s10"), ref, &where);
    EXPECT_LE(w, 1e-6) << "sharded checkpoint continued unsharded: " << where << " differs by " << w;
    world.barrier();
    if (world.rank() == 0) fs::remove_all(root);
    world.barrier();
  }
}

// ZeRO-3 before its first step: the parameters are still whole in the stage's
// arena, and the slices a checkpoint writes take them from there: the same
// file contents as an unsharded trainer's initial checkpoint.
TEST(Zero, Zero3CheckpointBeforeTheFirstStepHoldsTheInitialParameters) {
  Communicator world = Communicator::world();
  const Case k{"mlp", "adam", 1e-3};
  const std::string root = data_dir(world) + "/ckpt0";
  for (int zero : {0, 3}) {
    TrainConfig c = config(world, k, zero, 0);
    c.checkpoint.dir = root + "/z" + std::to_string(zero);
    Trainer t(c, world, quiet());
    t.save_checkpoint();
  }
  world.barrier();
  if (world.rank() == 0) {
    expect_bitwise(find_intact_checkpoint(root + "/z0").data, find_intact_checkpoint(root + "/z3").data,
                   "unsharded and ZeRO-3 initial checkpoints");
    fs::remove_all(root);
  }
  world.barrier();
}

TEST(Zero, BadInputNamesTheKey) {
  TrainConfig c;
  // The replaced key, on every rank (each rank reads the configuration): the error names the new one.
  for (const char* old : {"parallel.shard_optimizer=true", "parallel.shard_optimizer=false"}) {
    const std::string e = error_of([&] { c.set(old); });
    EXPECT_NE(e.find("parallel.shard_optimizer was replaced by parallel.zero = 1"), std::string::npos) << e;
  }
  Communicator world = Communicator::world();
  const std::string toml = data_dir(world) + "/bad-" + std::to_string(world.rank()) + ".toml";
  std::ofstream(toml) << "[parallel]\nshard_optimizer = true\n";
  std::string e = error_of([&] { TrainConfig t; t.load_toml(toml); });
  EXPECT_NE(e.find("parallel.shard_optimizer was replaced by parallel.zero = 1"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { c.set("parallel.zero=maybe"); }).find("parallel.zero"), std::string::npos);
  c.set("parallel.zero=4");
  EXPECT_NE(error_of([&] { c.validate(); }).find("parallel.zero"), std::string::npos);
  // ZeRO-1, 2 and 3 run on every layout (each stage and shard over its data-parallel group).
  for (const char* zero : {"parallel.zero=1", "parallel.zero=2", "parallel.zero=3"}) {
    c.set(zero);
    c.parallel.pipeline = 2;
    c.parallel.tensor = 2;
    EXPECT_EQ(error_of([&] { c.validate(); }), "<no error>") << zero;
    c.parallel.pipeline = c.parallel.tensor = 1;
    c.comm.fp16_allreduce = true;
    EXPECT_NE(error_of([&] { c.validate(); }).find("comm.fp16_allreduce"), std::string::npos) << zero;
    c.comm.fp16_allreduce = false;
  }
}

}  // namespace
