// gpt with a mixture of experts (model.experts, nn/moe.hpp) and expert
// parallelism (parallel.expert): at expert 2 (2 ranks) and expert 2 x data 2
// (4 ranks), dropless, the trainer follows the 1-rank trainer of the same data
// for 10 steps. The aux loss is computed per micro-batch, so the 1-rank run
// takes the same micro-batches (data.batch_size / ranks, train.accumulation =
// ranks) and the comparison holds with the aux loss on. Combinations not
// supported yet are refused by name on every rank (ZeRO, pipeline and tensor
// parallelism compose with experts: mpi_gpt_experts_compose.cpp). The epoch record carries
// the per-layer MoE metrics. With experts at 2 ranks: recomputation (at expert 1
// and 2), ZeRO-1, pipeline 2 and a checkpointed run continued at 1 rank follow 1
// rank too. Checkpoints written at expert 2 resume at expert 2 bitwise and at
// expert 1, expert 4 and 1 rank within rounding; their exports hold every expert.
// Aux-loss-free balancing (model.moe_bias_update_rate) follows 1 rank at expert 2
// and resumes from a checkpoint bitwise.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "gpt_fixtures.hpp"
#include "ringtrain/interop/safetensors.hpp"
#include "ringtrain/train/generate.hpp"
#include "ringtrain/train/interop.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
using test_fixtures::train_losses;

namespace {

TrainConfig moe_config(const std::string& data) {
  TrainConfig c = test_fixtures::gpt_test_config(data);
  c.model.experts = 4;
  c.model.top_k = 2;
  c.model.aux_loss_coeff = 0.01;
  return c;
}

}  // namespace

TEST(GptExperts, ExpertParallelLayoutsFollowTheOneRankTrainer) {
  Communicator world = Communicator::world();
  const int w = world.size();
  const std::string data = test_fixtures::gpt_text_corpus(world, "gpt_moe");
  const test_fixtures::GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  Communicator self = world.split(world.rank(), 0, "self");
  // AdamW (the gpt recipe) and SGD: Adam's update hardly sees a gradient's scale,
  // SGD's is proportional to it (a wrong 1/EP on the expert gradients shows there).
  for (const char* opt : {"adamw", "sgd"}) {
    TrainConfig base = moe_config(data);
    base.optimizer.name = opt;
    if (std::string(opt) == "sgd") {
      base.optimizer.lr = 0.5;
      base.optimizer.momentum = 0.9;
    }
    TrainConfig one = base;  // the micro-batches the ranks will take, one after the other
    one.data.batch_size = w == 2 || w == 4 ? 4 / w : 4;
    one.train.accumulation = w == 2 || w == 4 ? w : 1;
    const std::vector<double> ref = train_losses(one, self);
    ASSERT_EQ(ref.size(), 10u);
    EXPECT_LT(ref.back(), ref.front()) << opt;  // it learns
    if (w != 2 && w != 4) continue;
    TrainConfig ep = base;
    ep.data.batch_size = 4 / w;
    ep.parallel.expert = 2;  // at 4 ranks: expert 2 x data 2
    // fp32 summation order of the expert weight gradients (the all-to-all regroups
    // rows) and of the dense all-reduce, on losses ~5 at 4 ranks: measured <= 2.2e-8
    // (adamw) and 1.2e-7 (sgd at lr 0.5); tolerances ~10x that (<= 2e-7 relative).
    // Leaving out the 1/EP of the expert gradients moves the adamw losses by 5.6e-7.
    const double tol = std::string(opt) == "sgd" ? 1e-6 : 2e-7;
    test_fixtures::expect_losses_follow(train_losses(ep, world), ref, cat(opt, ": expert 2 x data ", w / 2), tol);
    if (w == 4) {
      TrainConfig ep4 = ep;
      ep4.parallel.expert = 4;
      test_fixtures::expect_losses_follow(train_losses(ep4, world), ref, cat(opt, ": expert 4"), tol);
    }
  }
  if (w != 2 && w != 4) GTEST_SKIP() << "the layouts need 2 or 4 ranks (the 1-rank MoE runs passed)";
}

TEST(GptExperts, UnsupportedCombinationsAreRefusedByName) {
  Communicator world = Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string data = test_fixtures::gpt_text_corpus(world, "gpt_moe_refuse");
  const test_fixtures::GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  auto refused = [&](TrainConfig c, const std::string& want) {
    try {
      train_losses(c, world);
      ADD_FAILURE() << "not refused: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  TrainConfig c = moe_config(data);
  c.parallel.expert = 2;
  TrainConfig v = c;  // (ZeRO, pipeline and tensor compose: mpi_gpt_experts_compose.cpp)
  v.train.verify_every = 1;
  refused(v, "parallel.expert = 2 with train.verify_every = 1");
  TrainConfig odd = c;
  odd.model.experts = 3;
  odd.model.top_k = 1;
  refused(odd, "is not divisible by parallel.expert = 2");
  if (world.size() == 3) {
    refused(c, "parallel.expert = 2 does not divide the data-parallel size 3");
  }
}

// The epoch record names each MoE layer (model.moe_every = 2 of 2 blocks: blocks.1 only)
// with its aux loss, the max/mean tokens per expert (in [1, E/k] by construction), per
// micro-batch and over the epoch's summed loads, and the
// dropped share, which a capacity factor of 1 makes positive on this corpus.
TEST(GptExperts, EpochRecordHasPerLayerMoeMetrics) {
  Communicator world = Communicator::world();
  const std::string data = test_fixtures::gpt_text_corpus(world, "gpt_moe_metrics");
  const test_fixtures::GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  TrainConfig c = moe_config(data);
  c.model.moe_every = 2;
  c.model.capacity_factor = 1.0;
  c.train.max_steps = 0;
  c.train.epochs = 1;
  c.data.batch_size = 8;
  c.log.metrics = data + "/metrics.jsonl";
  if (world.size() % 2 == 0) c.parallel.expert = 2;
  TrainerHooks hooks;
  hooks.report = true;
  Trainer(c, world, hooks).fit();
  if (world.rank() != 0) return;
  std::ifstream f(c.log.metrics);
  nlohmann::json epoch;
  for (std::string line; std::getline(f, line);)
    if (auto j = nlohmann::json::parse(line); j["event"] == "epoch") epoch = j;
  ASSERT_TRUE(epoch.contains("moe")) << epoch.dump();
  const auto& moe = epoch["moe"];
  EXPECT_EQ(moe.size(), 1u) << moe.dump();
  ASSERT_TRUE(moe.contains("blocks.1.moe")) << moe.dump();
  const auto& m = moe["blocks.1.moe"];
  EXPECT_GE(m["max_over_mean"].get<double>(), 1.0);
  EXPECT_LE(m["max_over_mean"].get<double>(), 4.0 / 2.0);
  // The epoch's summed loads: the max of sums is at most the sum of maxima (every
  // micro-batch routes the same number of tokens), so never above the per-micro-batch mean.
  EXPECT_GE(m["epoch_max_over_mean"].get<double>(), 1.0);
  EXPECT_LE(m["epoch_max_over_mean"].get<double>(), m["max_over_mean"].get<double>() + 1e-12);
  EXPECT_GT(m["aux"].get<double>(), 0.0);
  EXPECT_GT(m["dropped_fraction"].get<double>(), 0.0);
  EXPECT_LT(m["dropped_fraction"].get<double>(), 0.5);
  std::printf("[moe metrics] %s\n", moe.dump().c_str());
}

// At 2 ranks, with experts: data 2 (experts replicated) alone, with block
// recomputation (the forward reruns, exchanges included) at expert 2 too, with
// ZeRO-1, and pipeline 2 (MoE blocks on both stages), each against the 1-rank trainer of the same micro-batches; a run
// with experts cut at step 5 continues at 1 rank from its checkpoint (the
// expert weights' names and initial values do not depend on the layout).
TEST(GptExperts, FeaturesFollowTheOneRankTrainer) {
  Communicator world = Communicator::world();
  if (world.size() != 2) GTEST_SKIP() << "data 2 against 1 rank";
  const std::string data = test_fixtures::gpt_text_corpus(world, "gpt_moe_features");
  const test_fixtures::GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  Communicator self = world.split(world.rank(), 0, "self");
  TrainConfig one = moe_config(data);
  one.data.batch_size = 2;
  one.train.accumulation = 2;
  const std::vector<double> ref = train_losses(one, self);
  TrainConfig d2 = moe_config(data);
  d2.data.batch_size = 2;
  // As above: measured <= 2.2e-8; 2e-7 is ~10x.
  test_fixtures::expect_losses_follow(train_losses(d2, world), ref, "experts, data 2", 2e-7);
  for (int ep : {1, 2}) {
    TrainConfig r = d2;
    r.train.recompute = "block";
    r.parallel.expert = ep;
    test_fixtures::expect_losses_follow(train_losses(r, world), ref, cat("experts, recompute block, expert ", ep), 2e-7);
  }
  TrainConfig z = d2;
  z.parallel.zero = 1;
  test_fixtures::expect_losses_follow(train_losses(z, world), ref, "experts, data 2, ZeRO-1", 2e-7);
  TrainConfig pp = moe_config(data);  // 2 stages, the batch of 4 in 2 micro-batches: the same micro-batches
  pp.parallel.pipeline = 2;
  test_fixtures::expect_losses_follow(train_losses(pp, world), ref, "experts, pipeline 2", 2e-7);

  auto run = [&](const std::string& dir) {  // aux off: the 1-rank continuation takes whole batches of 4
    TrainConfig c = moe_config(data);
    c.model.aux_loss_coeff = 0;
    c.data.global_batch = 4;
    c.comm.deterministic = true;
    c.checkpoint.dir = dir;
    c.checkpoint.keep = 100;
    return c;
  };
  const std::vector<double> full = train_losses(run(data + "/full"), world);
  TrainConfig cut = run(data + "/cut");
  cut.train.max_steps = 5;
  const std::vector<double> first = train_losses(cut, world);
  ASSERT_EQ(first.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(first[i], full[i]) << "step " << i;
  world.barrier();
  if (world.rank() == 0) {
    const std::vector<double> rest = train_losses(run(data + "/cut"), self, "auto");
    // A different order of the same sums: 2e-7 as for the dense gpt (mpi_gpt_features.cpp).
    test_fixtures::expect_losses_follow(rest, std::vector<double>(full.begin() + 5, full.end()),
                                        "experts: cut at data 2, continued at 1 rank", 2e-7);
  }
  world.barrier();
}

// Checkpoints of an expert-parallel run (issue 43): at expert 2 each rank holds
// half of every MoE layer's experts, and the checkpoint — one file gathered on
// rank 0, or each rank's parts — stores every expert under its global index
// (blocks.i.moe.experts.e.*, weights and AdamW moments). A run cut at step 5
// (expert 2 at 2 ranks; expert 2 x data 2 at 4) continues at the same layout
// exactly as the uninterrupted run, and at expert 1 (every rank holds every
// expert), at expert 4 (4 ranks) and at 1 rank (the same micro-batches one
// after the other) within the layouts' rounding.
TEST(GptExperts, CheckpointsAtExpertTwoResumeAtAnyExpertSize) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (w != 2 && w != 4) GTEST_SKIP() << "expert 2 needs 2 or 4 ranks";
  const std::string data = test_fixtures::gpt_text_corpus(world, "gpt_moe_ckpt");
  const test_fixtures::GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  Communicator self = world.split(world.rank(), 0, "self");
  auto run = [&](const std::string& dir, int ep, bool parallel) {
    TrainConfig c = moe_config(data);  // aux on: per micro-batch, which every layout below keeps
    c.data.batch_size = 4 / w;         // global batch 4
    c.comm.deterministic = true;
    c.parallel.expert = ep;
    c.checkpoint.dir = dir;
    c.checkpoint.keep = 100;
    c.checkpoint.parallel = parallel;
    return c;
  };
  const std::vector<double> full = train_losses(run(data + "/full", 2, false), world);
  ASSERT_EQ(full.size(), 10u);
  const std::vector<double> tail(full.begin() + 5, full.end());
  for (bool parallel : {false, true}) {
    const std::string how = parallel ? "parts" : "one file", cut_dir = data + (parallel ? "/parts" : "/one");
    TrainConfig cut = run(cut_dir, 2, parallel);
    cut.train.max_steps = 5;
    const std::vector<double> first = train_losses(cut, world);
    ASSERT_EQ(first.size(), 5u);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(first[i], full[i]) << how << " step " << i;
    // Each continuation from its own copy of the step-5 checkpoint (a continuation writes newer ones).
    auto copy = [&](const std::string& tag) {
      const std::string to = cut_dir + "-" + tag;
      world.barrier();
      if (world.rank() == 0) std::filesystem::copy(cut_dir, to, std::filesystem::copy_options::recursive);
      world.barrier();
      return to;
    };
    const std::string e2 = copy("e2");
    const std::vector<double> same = train_losses(run(e2, 2, parallel), world, e2);
    ASSERT_EQ(same.size(), 5u) << how;
    for (int i = 0; i < 5; ++i) EXPECT_EQ(same[i], tail[i]) << how << ": expert 2 -> expert 2, step " << 5 + i;
    // Another expert size sums the expert gradients in another order (the all-to-all regroups
    // rows): measured <= 1.3e-8 here (2.2e-8 for the layouts above) on losses ~5; 2e-7 is ~10x.
    for (int ep : {1, 4}) {
      if (ep > w) continue;
      const std::string d = copy(cat("e", ep));
      test_fixtures::expect_losses_follow(train_losses(run(d, ep, parallel), world, d), tail,
                                          cat("experts: cut at expert 2 (", how, "), continued at expert ", ep,
                                              " x data ", w / ep), 2e-7);
    }
    const std::string r1 = copy("r1");
    if (world.rank() == 0) {
      TrainConfig one = run(r1, 1, parallel);
      one.data.batch_size = 4 / w;
      one.train.accumulation = w;  // the ranks' micro-batches, one after the other
      test_fixtures::expect_losses_follow(train_losses(one, self, r1), tail,
                                          cat("experts: cut at expert 2 (", how, "), continued at 1 rank"), 2e-7);
    }
    world.barrier();
  }

  // Export of the step-5 checkpoints (safetensors; ringtrain's names for the MoE parts): every
  // expert of every MoE block, and the one file (gathered on rank 0) and the parts (written by
  // each rank from its experts) give the same tensors bit for bit. llm.c's dense file is refused.
  ExportOptions o;
  export_checkpoint(data + "/one", data + "/one.safetensors", o, world);
  export_checkpoint(data + "/parts", data + "/parts.safetensors", o, world);
  if (world.rank() == 0) {
    const safetensors::Reader a(data + "/one.safetensors"), b(data + "/parts.safetensors");
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    for (int blk = 0; blk < 2; ++blk)
      for (int e = 0; e < 4; ++e)
        for (const char* part : {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"})
          EXPECT_TRUE(a.find(cat("blocks.", blk, ".moe.experts.", e, ".", part))) << blk << " " << e << " " << part;
    for (const auto& t : a.tensors()) {
      const safetensors::TensorInfo* u = b.find(t.name);
      ASSERT_TRUE(u) << t.name;
      const Tensor x = a.read(t), y = b.read(*u);
      EXPECT_EQ(x.shape(), y.shape()) << t.name;
      EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << t.name;
    }
  }
  // generate runs at 1 rank whatever layout wrote the checkpoint: under the expert-2 job's own
  // configuration (parallel.expert = 2 included) it gives the 1-rank configuration's text.
  if (world.rank() == 0) {
    GenerateOptions gen;
    gen.tokens = 24;
    gen.seed = 3;
    gen.top_k = 10;
    const auto a = generate_from_checkpoint(run(data + "/one", 2, false), data + "/one", "the quick", gen, self);
    const auto b = generate_from_checkpoint(run(data + "/one", 1, false), data + "/one", "the quick", gen, self);
    EXPECT_EQ(a.tokens.size(), 24u);
    EXPECT_EQ(a.text, b.text) << "the expert-2 configuration generates other text";
  }
  world.barrier();
  o.format = "llmc";
  try {
    export_checkpoint(data + "/one", data + "/m.bin", o, world);
    ADD_FAILURE() << "llm.c export of an MoE checkpoint not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has model.experts = 4; llm.c's file holds a dense GPT-2"), std::string::npos)
        << e.what();
  }
}

// Aux-loss-free balancing: the bias moves by sign steps of loads summed over every
// rank, so expert 2 (tokens split over the ranks) picks the same experts as the
// 1-rank trainer taking the same micro-batches; the bias is a checkpoint buffer,
// so a run cut at step 5 continues bitwise.
TEST(GptExperts, BiasBalancingFollowsOneRankAndResumesBitwise) {
  Communicator world = Communicator::world();
  const int w = world.size();
  const std::string data = test_fixtures::gpt_text_corpus(world, "gpt_moe_bias");
  const test_fixtures::GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  Communicator self = world.split(world.rank(), 0, "self");
  const int split = w == 2 || w == 4 ? w : 1;
  auto cfg = [&](double rate) {
    TrainConfig c = moe_config(data);
    c.model.moe_bias_update_rate = rate;  // 0.01: large enough to change routing within 10 steps
    c.data.batch_size = 4 / split;
    c.train.accumulation = split;  // the ranks' micro-batches, one after the other
    return c;
  };
  const std::vector<double> ref = train_losses(cfg(0.01), self);
  const std::vector<double> off = train_losses(cfg(0), self);
  ASSERT_EQ(ref.size(), 10u);
  ASSERT_EQ(off.size(), 10u);
  EXPECT_EQ(ref[0], off[0]);  // the bias starts at zero
  double moved = 0;
  for (int i = 5; i < 10; ++i) moved = std::max(moved, std::fabs(ref[i] - off[i]));
  std::printf("[moe bias] max |loss with bias - without| over steps 5-9: %.3g\n", moved);
  EXPECT_GT(moved, 1e-5) << "the bias update did not change the losses of steps 5-9";
  if (split == 1) GTEST_SKIP() << "expert 2 needs 2 or 4 ranks (the 1-rank runs passed)";
  auto run = [&](const std::string& dir, bool parallel) {
    TrainConfig c = cfg(0.01);
    c.train.accumulation = 1;
    c.parallel.expert = 2;
    c.comm.deterministic = true;
    c.checkpoint.dir = dir;
    c.checkpoint.keep = 100;
    c.checkpoint.parallel = parallel;
    return c;
  };
  const std::vector<double> full = train_losses(run(data + "/full", false), world);
  // As for the layouts above (same model and data): measured 9.9e-9 at 2 ranks; 2e-7 is ~10x.
  // Each rank updating from its own loads (no all-reduce) was 3.5e-3 off; leaving the bias
  // out of the checkpoint broke the bitwise resume below (both tried once, by hand).
  test_fixtures::expect_losses_follow(full, ref, "bias balancing, expert 2", 2e-7);
  for (bool parallel : {false, true}) {  // one file, and each rank's parts
    const std::string dir = data + (parallel ? "/cut-parts" : "/cut-one");
    TrainConfig cut = run(dir, parallel);
    cut.train.max_steps = 5;
    const std::vector<double> first = train_losses(cut, world);
    ASSERT_EQ(first.size(), 5u);
    const std::vector<double> rest = train_losses(run(dir, parallel), world, dir);
    ASSERT_EQ(rest.size(), 5u);
    for (int i = 0; i < 5; ++i)
      EXPECT_EQ(rest[i], full[5 + i]) << "bias balancing resumed at step 5 (" << (parallel ? "parts" : "one file")
                                      << "), step " << 5 + i;
  }
}
