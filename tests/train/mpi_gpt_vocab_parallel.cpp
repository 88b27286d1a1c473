// The gpt model's vocabulary-parallel embedding, head and loss at tensor 2
// (nn/language.hpp), against the 1-rank model:
//  - each tensor rank's embedding rows are bitwise the 1-rank weight's slice;
//    the head's logits are [N, T, V/2] (no rank holds [N, T, V]) and equal the
//    1-rank logits' columns; the vocabulary-parallel loss and every
//    parameter's gradient equal the 1-rank ones; with and without sequence
//    parallelism; a vocabulary the tensor ranks do not divide stays replicated;
//  - ZeRO-3 with the tied head (the head gathers the embedding's bucket) over
//    the world, with tensor 2 too (and accumulation 2 with block
//    recomputation), follows the 1-rank trainer for 10 steps, as ZeRO-1 and 2 do;
//  - a tensor-2 checkpoint loads at 1 rank with bitwise the tensor-2 run's
//    parameters (the embedding saved whole under its name).
// The tensor-2 trainer against 1 rank and generation from its checkpoint are
// in mpi_gpt_trainer.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "gpt_fixtures.hpp"
#include "ringtrain/nn/language.hpp"
#include "ringtrain/nn/lm_loss.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/nn/rng.hpp"
#include "support/whole_model.hpp"

using namespace ringtrain;
using namespace ringtrain::test_fixtures;

namespace {

ModelConfig gpt_model(std::int64_t vocab, bool sequence) {
  ModelConfig m;
  m.name = "gpt";
  m.classes = vocab;
  m.seq_len = 16;
  m.base_width = 16;
  m.heads = 4;
  m.depth = 2;
  m.mlp_ratio = 2.0;
  m.sequence = sequence;
  return m;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double w = 0;
  for (std::int64_t i = 0; i < a.numel() && a.shape() == b.shape(); ++i)
    w = std::max(w, std::fabs(double(a.data<float>()[i]) - double(b.data<float>()[i])));
  return w;
}

// Columns [first, first + n) of [rows, V] logits.
Tensor columns(const Tensor& whole, std::int64_t first, std::int64_t n) {
  const std::int64_t v = whole.dim(whole.ndim() - 1), rows = whole.numel() / v;
  Tensor out = Tensor::empty({rows, n});
  for (std::int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data<float>() + r * n, whole.data<float>() + r * v + first, std::size_t(n) * sizeof(float));
  return out;
}

bool pairs_of_ranks(const Communicator& world) { return world.size() == 2 || world.size() == 4; }

}  // namespace

TEST(GptVocabParallel, HeadGivesThisRanksSliceAndEqualsOneRank) {
  Communicator world = Communicator::world();
  if (!pairs_of_ranks(world)) GTEST_SKIP() << "needs 2 or 4 ranks (tensor groups of 2)";
  Communicator pair = world.split(world.rank() / 2, world.rank() % 2, "pair");
  const TensorGroup g = TensorGroup::of(pair);
  const std::int64_t n = 4, t = 16, V = 256, local = V / 2;
  Tensor x = Tensor::empty({n, t}), y = Tensor::empty({n, t}, DType::i64);
  for (std::int64_t i = 0; i < n * t; ++i) {
    x.data<float>()[i] = float(std::int64_t(counter_uniform(3, 0, std::uint64_t(i)) * V) % V);
    y.data<std::int64_t>()[i] = std::int64_t(counter_uniform(3, 1, std::uint64_t(i)) * V) % V;
  }
  for (bool sequence : {false, true}) {
    const std::string what = sequence ? "with sequence parallelism" : "without sequence parallelism";
    ModelConfig one = gpt_model(V, sequence), two = one;
    two.tensor = g;
    Stage a(one, Device::cpu()), b(two, Device::cpu());
    // The embedding's rows: bitwise the 1-rank weight's slice.
    const std::size_t w = b.arena().index_of("wte.weight");
    const ShardSpec& s = b.arena().info(w).shard;
    ASSERT_TRUE(s.sharded()) << what;
    EXPECT_EQ(s.global, (Shape{V, 16}));
    EXPECT_EQ(b.arena().param(w).shape(), (Shape{local, 16}));
    const Tensor mine = shard_of(a.arena().param(a.arena().index_of("wte.weight")), s);
    EXPECT_EQ(std::memcmp(mine.raw(), b.arena().param(w).raw(), mine.nbytes()), 0) << what;

    // With sequence parallelism the embedding reduce-scatters into the first block's token shards.
    EXPECT_EQ(b.layer(0).output_shape({n, t}), (Shape{n, sequence ? t / 2 : t, 16})) << what;
    const Tensor la = a.forward(0, x, Mode::train), lb = b.forward(0, x, Mode::train);
    ASSERT_EQ(lb.shape(), (Shape{n, t, local})) << what << ": the head's logits are this rank's V/2 columns";
    EXPECT_EQ(2 * lb.nbytes(), la.nbytes());
    const double dlogit = max_abs_diff(lb.reshape({n * t, local}), columns(la, g.rank * local, local));
    EXPECT_LE(dlogit, 1e-6) << what;  // the blocks' row reductions sum in another order: 1.1e-7 measured

    Tensor da = Tensor::empty(la.shape()), db = Tensor::empty({n * t, local});
    const double loss_a = softmax_cross_entropy(la, y, 0.0, da);
    const double loss_b = vocab_parallel_cross_entropy(lb.reshape({n * t, local}), y.reshape({n * t}), g, db);
    EXPECT_NEAR(loss_b, loss_a, 3e-8) << what;  // 2.3e-9 measured
    EXPECT_EQ(vocab_parallel_count_correct(lb.reshape({n * t, local}), y.reshape({n * t}), g), count_correct(la, y));
    a.zero_grads();
    b.zero_grads();
    test_support::backward(a, da);
    test_support::backward(b, db.reshape(lb.shape()));
    double dgrad = 0;
    std::string where;
    for (std::size_t i = 0; i < b.arena().size(); ++i) {
      const ParamInfo& info = b.arena().info(i);
      Tensor ref = a.arena().grad(a.arena().index_of(info.name));
      if (info.shard.sharded()) ref = shard_of(ref, info.shard);
      const double d = max_abs_diff(b.arena().grad(i), ref);
      if (d > dgrad) dgrad = d, where = info.name;
    }
    EXPECT_LE(dgrad, 4e-7) << what << ": worst at " << where;  // 3.4e-8 measured
    if (world.rank() == 0)
      std::printf("[gpt vocab-parallel] %s: logits per rank %zu B at tensor 1, %zu B at tensor 2; max |logit diff| "
                  "%.1e, |loss diff| %.1e, max |grad diff| %.1e (%s)\n",
                  what.c_str(), la.nbytes(), lb.nbytes(), dlogit, std::fabs(loss_a - loss_b), dgrad, where.c_str());
  }
  // A vocabulary the tensor ranks do not divide: embedding and head stay replicated, whole logits.
  ModelConfig odd = gpt_model(255, false);
  odd.tensor = g;
  Stage c(odd, Device::cpu());
  EXPECT_FALSE(c.arena().info(c.arena().index_of("wte.weight")).shard.sharded());
  EXPECT_EQ(c.output_shape(n), (Shape{n, t, 255}));
}

TEST(GptVocabParallel, ZeroWithTheTiedHeadFollowsOneRank) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (!pairs_of_ranks(world)) GTEST_SKIP() << "needs 2 or 4 ranks";
  const std::string data = gpt_text_corpus(world, "gptvocab-zero");
  const GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  Communicator self = world.split(world.rank(), 0, "self");
  TrainConfig c = gpt_test_config(data);
  // Buckets of 4 KiB: the embedding (16 KiB) is a bucket of its own, so the
  // head, in the first bucket with the last block and norm, reads a bucket it
  // does not own.
  c.comm.bucket_bytes = 4096;
  const std::vector<double> ref = train_losses(c, self);
  TrainConfig z = c;
  z.parallel.zero = 3;
  z.data.batch_size = 4 / w;
  // 2e-7: 10x the largest measured difference of these runs at 2 and 4 ranks (1.6e-8: fp32 sums in
  // another order), well inside the 1e-5.
  expect_losses_follow(train_losses(z, world), ref, cat("ZeRO-3 over ", w), 2e-7);
  for (int stage : {1, 2}) {  // the tied weight's gradient in one bucket, as at ZeRO-3
    TrainConfig zs = z;
    zs.parallel.zero = stage;
    expect_losses_follow(train_losses(zs, world), ref, cat("ZeRO-", stage, " over ", w), 2e-7);
  }
  TrainConfig zt = z;  // tensor 2 x ZeRO-3 over w/2: the embedding's rows are split, then sliced
  zt.parallel.tensor = 2;
  zt.data.batch_size = 4 / (w / 2);
  expect_losses_follow(train_losses(zt, world), ref, cat("tensor 2 x ZeRO-3 over ", w / 2), 2e-7);
  // Two micro-batches per step (each gathers again; the tied gradient accumulates over both) and
  // block recomputation (the embedding's replay reduce-scatters again).
  TrainConfig za = zt;
  za.train.accumulation = 2;
  za.data.batch_size = zt.data.batch_size / 2;
  za.train.recompute = "block";
  expect_losses_follow(train_losses(za, world), ref,
                       cat("tensor 2 x ZeRO-3 over ", w / 2, ", accumulation 2, recompute block"), 2e-7);
}

TEST(GptVocabParallel, TensorTwoCheckpointLoadsAtOneRankBitwise) {
  Communicator world = Communicator::world();
  if (world.size() != 2) GTEST_SKIP() << "runs at 2 ranks (tensor 2, loaded at 1 rank)";
  const std::string data = gpt_text_corpus(world, "gptvocab-ckpt");
  const GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  Communicator self = world.split(world.rank(), 0, "self");
  TrainConfig c = gpt_test_config(data);
  TrainConfig t = c;
  t.parallel.tensor = 2;
  t.checkpoint.dir = data + "/tensor2";
  Trainer two(t, world, quiet_hooks());
  two.fit();
  world.barrier();
  Trainer one(c, self, quiet_hooks());
  one.load_weights(t.checkpoint.dir);
  const ParamArena& mine = two.parameters();
  const ParamArena& whole = one.parameters();
  ASSERT_EQ(mine.size(), whole.size());
  int split = 0;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const ParamInfo& info = mine.info(i);
    Tensor ref = whole.param(whole.index_of(info.name));
    if (info.shard.sharded()) ref = shard_of(ref, info.shard), ++split;
    ASSERT_EQ(ref.shape(), mine.param(i).shape()) << info.name;
    EXPECT_EQ(std::memcmp(ref.raw(), mine.param(i).raw(), ref.nbytes()), 0) << info.name << " differs";
  }
  EXPECT_TRUE(mine.info(mine.index_of("wte.weight")).shard.sharded());
  EXPECT_GT(split, 1);
}
