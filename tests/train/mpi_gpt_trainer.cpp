// The gpt language model on a byte-level text corpus: at data 2, tensor 2
// (with and without sequence parallelism) and tensor 2 x data 2 the trainer
// follows the 1-rank trainer for 10 steps (2e-7, dropout on: the masks follow
// the samples, not the layout); a model trained at tensor 2 generates the same
// text from a seed as one trained at 1 rank, and the same text twice.
// Pipeline layouts: mpi_gpt_pipeline.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gpt_fixtures.hpp"
#include "ringtrain/data/prepare.hpp"
#include "ringtrain/train/generate.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
using test_fixtures::train_losses;

namespace {

void expect_follows(const std::vector<double>& got, const std::vector<double>& ref, const std::string& what) {
  test_fixtures::expect_losses_follow(got, ref, what, 2e-7);  // fp32 rounding: <= 2e-8 measured
}

}  // namespace

TEST(GptTrainer, LayoutsFollowTheOneRankTrainer) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (w != 2 && w != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  const std::string data = test_fixtures::gpt_text_corpus(world, "gpt");
  const test_fixtures::GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  Communicator self = world.split(world.rank(), 0, "self");
  TrainConfig c = test_fixtures::gpt_test_config(data);
  const std::vector<double> ref = train_losses(c, self);  // 1 rank, batch 4
  ASSERT_EQ(ref.size(), 10u);
  EXPECT_LT(ref.back(), ref.front());  // it learns
  TrainConfig dp = c;  // data w: the global batch of 4 spread over the ranks
  dp.data.batch_size = 4 / w;
  expect_follows(train_losses(dp, world), ref, cat("data ", w));
  TrainConfig big = c;  // tensor 2 x data w/2: global batch 4 * w/2
  big.data.batch_size = 4 * (w / 2);
  const std::vector<double> ref_big = w == 2 ? ref : train_losses(big, self);
  for (bool sequence : {false, true}) {
    TrainConfig t = c;
    t.parallel.tensor = 2;
    t.parallel.sequence = sequence;
    t.train.verify_every = 1;
    expect_follows(train_losses(t, world), ref_big, cat("tensor 2 x data ", w / 2, sequence ? " with sequence" : ""));
  }
}

TEST(GptTrainer, GenerationIsReproducibleAndLayoutIndependent) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (w != 2) GTEST_SKIP() << "runs at 2 ranks (tensor 2 against 1 rank)";
  const std::string data = test_fixtures::gpt_text_corpus(world, "gpt");
  const test_fixtures::GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  Communicator self = world.split(world.rank(), 0, "self");
  TrainConfig c = test_fixtures::gpt_test_config(data);
  c.model.dropout = 0;
  c.checkpoint.dir = cat(data, "/one-", world.rank());  // each rank trains the 1-rank model into its own dir
  train_losses(c, self);
  TrainConfig t = c;
  t.parallel.tensor = 2;
  t.checkpoint.dir = data + "/tensor2";
  train_losses(t, world);
  world.barrier();
  GenerateOptions o;
  o.tokens = 40;
  o.seed = 5;
  o.top_k = 20;
  o.temperature = 0.8;
  const auto a = generate_from_checkpoint(c, c.checkpoint.dir, "the quick", o, self);
  const auto b = generate_from_checkpoint(c, c.checkpoint.dir, "the quick", o, self);
  const auto d = generate_from_checkpoint(c, t.checkpoint.dir, "the quick", o, self);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.tokens.size(), 40u);
  EXPECT_EQ(a.text.substr(0, 9), "the quick");
  EXPECT_EQ(a.text, d.text) << "tensor 2's checkpoint generates other text";  // 1e-6 apart: same draws
  o.seed = 6;
  EXPECT_NE(generate_from_checkpoint(c, c.checkpoint.dir, "the quick", o, self).text, a.text);
}

TEST(GptTrainer, EpochRecordHasPerplexityTokensPerSecondAndMfu) {
  Communicator world = Communicator::world();
  const std::string data = test_fixtures::gpt_text_corpus(world, "gpt");
  const test_fixtures::GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  TrainConfig c = test_fixtures::gpt_test_config(data);
  c.train.max_steps = 0;
  c.train.epochs = 1;
  c.data.batch_size = 8;
  c.log.metrics = data + "/metrics.jsonl";
  TrainerHooks hooks;
  hooks.report = true;
  Trainer t(c, world, hooks);
  const TrainResult r = t.fit();
  ASSERT_TRUE(r.last.evaluated);
  EXPECT_EQ(r.last.tokens_per_sample, 16);
  EXPECT_GT(r.last.test_loss, 0);
  EXPECT_LT(r.last.test_loss, std::log(256.0));  // better than uniform over the bytes after an epoch
  if (world.rank() != 0) return;
  std::ifstream f(c.log.metrics);
  nlohmann::json epoch;
  for (std::string line; std::getline(f, line);)
    if (auto j = nlohmann::json::parse(line); j["event"] == "epoch") epoch = j;
  ASSERT_FALSE(epoch.is_null());
  EXPECT_DOUBLE_EQ(epoch["test_perplexity"].get<double>(), std::exp(epoch["test_loss"].get<double>()));
  EXPECT_DOUBLE_EQ(epoch["tokens_per_s"].get<double>(), 16 * epoch["images_per_s"].get<double>());
  const double mfu = epoch["mfu"].get<double>();
  EXPECT_GT(mfu, 0);
  EXPECT_LT(mfu, 1.5);  // model FLOP/s against the measured matmul peak (small matmuls: far below it)
  EXPECT_DOUBLE_EQ(epoch["model_flops_per_s"].get<double>() / epoch["matmul_peak_flops"].get<double>(), mfu);
}
