// train.precision = bf16 through the tensor-, sequence- and vocabulary-parallel
// layers (issue 31), against the 1-rank bf16 run:
//  - the sums over a tensor group of bfloat16 tensors (tp_all_reduce in place
//    and into another tensor, seq_reduce_scatter) are MPI_Allreduce's float32
//    sum rounded to bf16 once, bitwise, on values whose float32 sum is exact
//    but whose bf16 partial sums are not (2, 3 and 4 ranks);
//  - a dropout on a feature shard in bf16 is bitwise its part of the whole
//    layer's bf16 dropout (2 to 4 ranks);
//  - at tensor 2 the stages of vit and gpt (with and without sequence
//    parallelism) and of a `layers` model with a dropout on a feature shard
//    really run bf16 (Stage::activation_dtype), and the vocabulary-parallel
//    embedding's bf16 rows are bitwise the tensor-1 rows;
//  - the trainer, 10 steps with dropout on: vit, gpt and that `layers` model at
//    tensor 2, tensor 2 + sequence, data 2 and data 2 with ZeRO-1/2/3 (2 ranks),
//    or tensor 2 x data 2 (with and without sequence), tensor 2 x pipeline 2
//    and data 4 with ZeRO-1/2/3 (4 ranks), each follow the 1-rank bf16 run of
//    the same model and data; the tensor-2 bf16 losses are not bitwise the
//    tensor-2 fp32 run's.
// Other rank counts skip what needs tensor groups of 2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <mpi.h>

#include "gpt_fixtures.hpp"
#include "ringtrain/nn/rng.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
using test_fixtures::train_losses;

namespace {

// ---- the bf16 sums --------------------------------------------------------------------

// bfloat16 numbers +-k 2^(e-7), k in [128, 256), e in [-4, 8] (element i of
// rank r): multiples of 2^-11 below 2^9, so up to 4 of them sum exactly in
// float32 in any order (22 bits), while bf16 (8 bits) must round the sums.
std::vector<float> bf16_values(int rank, std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const auto draw = [&](std::uint64_t stream) { return counter_uniform(5 + stream, std::uint64_t(rank), std::uint64_t(i)); };
    const int k = 128 + int(draw(0) * 128), e = int(draw(1) * 13) - 4;
    v[std::size_t(i)] = float(std::ldexp(draw(2) < 0.5 ? -k : k, e - 7));
  }
  return v;
}

Tensor as_bf16(const std::vector<float>& v, const Shape& s) {
  Tensor t = Tensor::empty(s, DType::bf16);
  for (std::size_t i = 0; i < v.size(); ++i) t.data<bfloat16>()[i] = to_bf16(v[i]);
  return t;
}

// The elements of a and b whose bits differ.
std::int64_t differing(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  std::int64_t k = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) k += a.data<bfloat16>()[i].bits != b.data<bfloat16>()[i].bits;
  return k;
}

// ---- models and runs ----------------------------------------------------------------------

constexpr int kSteps = 10;

// A [[model.layers]] model with a dropout on fc1's feature shard (between the
// column and row layers), on tokens: every layer of it takes bf16.
const char* kShardedDropout = R"(
[model]
name = "layers"
[[model.layers]]
type = "patch_embed"
patch = 7
out = 16
[[model.layers]]
type = "linear"
name = "fc1"
out = 64
relu = true
tensor = "column"
[[model.layers]]
type = "dropout"
p = 0.2
[[model.layers]]
type = "linear"
name = "fc2"
out = 16
tensor = "row"
[[model.layers]]
type = "token_mean"
[[model.layers]]
type = "linear"
name = "head"
)";

TrainConfig image_config(const std::string& data, const std::string& model) {
  TrainConfig c = test_fixtures::small_config(data);
  if (model == "layers") {
    const auto path = std::filesystem::path(data) / "layers.toml";
    c.load_toml(path.string());  // written by the fixture
  } else {
    c.model.name = "vit";
    c.model.width = 16;  // 4 heads of 4, hidden 32, 2 blocks, 16 tokens (7x7 patches of 28x28)
    c.model.heads = 4;
    c.model.depth = 2;
    c.model.mlp_ratio = 2.0;
    c.model.patch = 7;
    c.model.dropout = 0.1;
  }
  c.data.batch_size = 16;
  c.train.epochs = 1;
  c.train.max_steps = kSteps;
  c.schedule.name = "constant";
  c.optimizer.name = "adamw";
  c.optimizer.lr = 3e-3;
  c.optimizer.momentum = 0;
  return c;
}

TrainConfig with_precision(TrainConfig c, const char* p) {
  c.train.precision = p;
  return c;
}

// The model the trainer builds from c (run_options.cpp's model_config), at tensor group g.
ModelConfig model_of(const TrainConfig& c, const TensorGroup& g) {
  ModelConfig m;
  m.name = c.model.name;
  if (c.model.name == "gpt") {
    m.classes = 256;  // the byte corpus
    m.seq_len = c.data.seq_len;
  }
  m.depth = c.model.depth;
  m.base_width = c.model.width;
  m.dropout = c.model.dropout;
  m.heads = c.model.heads;
  m.mlp_ratio = c.model.mlp_ratio;
  m.patch = c.model.patch;
  m.layers = c.model.layers;
  m.sequence = c.parallel.sequence;
  m.seed = c.train.seed;
  m.math = parse_math_mode(c.train.precision);
  m.tensor = g;
  return m;
}

// Every step's loss within tol of the reference's; returns the largest difference.
double expect_follows(const std::vector<double>& got, const std::vector<double>& ref, const std::string& what,
                      double tol) {
  EXPECT_EQ(got.size(), ref.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    EXPECT_NEAR(got[i], ref[i], tol) << what << " step " << i;
    worst = std::max(worst, std::fabs(got[i] - ref[i]));
  }
  if (Communicator::world().rank() == 0)
    std::printf("[bf16 layouts] %s: max |loss - 1-rank bf16 loss| %.2e (tolerance %.1e)\n", what.c_str(), worst, tol);
  return worst;
}

// Shared per binary: the image data, the `layers` model file and the byte corpus.
class Bf16Layouts : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = Communicator::world();
    images_ = test_fixtures::synthetic_mnist_like(world_, "bf16lay", 160, 32);
    if (world_.rank() == 0) std::ofstream(std::filesystem::path(images_) / "layers.toml") << kShardedDropout;
    world_.barrier();
    text_ = test_fixtures::gpt_text_corpus(world_, "bf16laygpt");
  }
  void TearDown() override {
    world_.barrier();
    if (world_.rank() == 0) {
      std::filesystem::remove_all(images_);
      std::filesystem::remove_all(std::filesystem::path(text_).parent_path());
    }
  }
  TrainConfig config(const std::string& model) const {
    if (model != "gpt") return with_precision(image_config(images_, model), "bf16");
    TrainConfig c = test_fixtures::gpt_test_config(text_);  // 10 steps, dropout 0.1, batch 4
    c.train.precision = "bf16";
    return c;
  }
  Communicator world_;
  std::string images_, text_;
};

}  // namespace

TEST(Bf16Sums, TensorGroupSumsInFloat32RoundedOnce) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (w < 2) GTEST_SKIP() << "a sum over a group needs 2 ranks";
  const TensorGroup g = TensorGroup::of(world);
  const std::int64_t B = 3, S = 4 * w, D = 40, n = B * S * D;
  const std::vector<float> mine = bf16_values(world.rank(), n);
  // The reference: MPI's float32 sum (exact for these values), rounded to bf16 once.
  std::vector<float> sum(mine.size());
  MPI_Allreduce(mine.data(), sum.data(), int(n), MPI_FLOAT, MPI_SUM, world.handle());
  const Tensor want = as_bf16(sum, {B, S, D});

  Tensor t = as_bf16(mine, {B, S, D});
  tp_all_reduce(t, g);
  EXPECT_EQ(differing(t, want), 0) << "in-place all-reduce";
  Tensor out = Tensor::empty({B * S, D}, DType::bf16);
  tp_all_reduce(as_bf16(mine, {B, S, D}), out, g);
  EXPECT_EQ(differing(out, want), 0) << "all-reduce into another tensor";

  // The reduce-scatter of sequence parallelism: this rank's S/w tokens of every sample.
  Tensor shard = Tensor::empty({B, S / w, D}, DType::bf16);
  seq_reduce_scatter(as_bf16(mine, {B, S, D}), shard, g);
  Tensor want_shard = Tensor::empty({B, S / w, D}, DType::bf16);
  seq_slice(want, want_shard, g);
  EXPECT_EQ(differing(shard, want_shard), 0) << "sequence reduce-scatter";

  // The values do tell: summed in bf16 rank by rank (rounded at each step, as
  // a ring over bf16 would), many elements differ from the float32 sum at 3+ ranks.
  std::vector<std::vector<float>> all(static_cast<std::size_t>(w));
  for (int r = 0; r < w; ++r) all[std::size_t(r)] = bf16_values(r, n);
  std::vector<float> stepwise(mine.size());
  for (std::int64_t i = 0; i < n; ++i) {
    float s = all[0][std::size_t(i)];
    for (int r = 1; r < w; ++r) s = to_f32(to_bf16(s + all[std::size_t(r)][std::size_t(i)]));
    stepwise[std::size_t(i)] = s;
  }
  const std::int64_t off = differing(as_bf16(stepwise, {B, S, D}), want);
  if (w >= 3) {
    EXPECT_GT(off, n / 20) << "the test values do not tell one rounding from several";
  }
  if (world.rank() == 0)
    std::printf("[bf16 sums] %d ranks: %lld of %lld elements differ when rounded at every step\n", w,
                static_cast<long long>(off), static_cast<long long>(n));
}

// The dropout on a feature shard (between a column and a row layer) in bf16:
// bitwise this rank's part of the whole layer's bf16 dropout (the backend's), both ways.
TEST(Bf16ShardedDropout, IsTheWholeBf16DropoutsPartBitwise) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (w < 2) GTEST_SKIP() << "a feature shard needs 2 ranks";
  const TensorGroup g = TensorGroup::of(world);
  ParamArena none_w, none_m;  // a dropout has no parameters
  none_w.finalize(Device::cpu());
  none_m.finalize(Device::cpu());
  Dropout whole("dropout", 0.3), mine("dropout", 0.3);
  mine.shard_features(g.size, g.rank);
  whole.bind(BindContext{backend_for(Device::cpu()), Device::cpu(), none_w, 7});
  mine.bind(BindContext{backend_for(Device::cpu()), Device::cpu(), none_m, 7});
  const Shape shape = {3, 5, 8 * std::int64_t(w)};
  const ShardSpec s = make_shard(shape, 2, g.size, g.rank);
  const std::int64_t n = shape_numel(shape);
  const Tensor x = as_bf16(bf16_values(0, n), shape), dy = as_bf16(bf16_values(1, n), shape);
  ASSERT_TRUE(mine.takes_bf16());
  const Tensor yw = whole.forward(x, Mode::train), ym = mine.forward(shard_of(x, s), Mode::train);
  ASSERT_EQ(ym.dtype(), DType::bf16);
  EXPECT_EQ(differing(ym, shard_of(yw, s)), 0) << "dropout forward";
  std::int64_t zeros = 0;
  for (std::int64_t i = 0; i < yw.numel(); ++i) zeros += yw.data<bfloat16>()[i].bits == 0;
  EXPECT_GT(zeros, 0) << "the mask is not trivial";
  const Tensor dw = whole.backward(dy, true, false), dm = mine.backward(shard_of(dy, s), true, false);
  EXPECT_EQ(differing(dm, shard_of(dw, s)), 0) << "dropout backward";
}

TEST_F(Bf16Layouts, TensorTwoStagesRunBf16) {
  const int w = world_.size();
  if (w != 2 && w != 4) GTEST_SKIP() << "needs 2 or 4 ranks (tensor groups of 2)";
  Communicator pair = world_.split(world_.rank() / 2, world_.rank() % 2, "pair");
  const TensorGroup g = TensorGroup::of(pair);
  for (const char* model : {"vit", "gpt", "layers"})
    for (bool sequence : {false, true}) {
      TrainConfig c = config(model);
      c.parallel.sequence = sequence;
      const std::string what = cat(model, sequence ? " with sequence parallelism" : "");
      Stage b16(model_of(c, g), Device::cpu()), b32(model_of(with_precision(c, "fp32"), g), Device::cpu());
      EXPECT_EQ(b16.activation_dtype(), DType::bf16) << what << ": every layer takes bf16 at tensor 2";
      EXPECT_EQ(b32.activation_dtype(), DType::f32) << what;
    }
  // The vocabulary-parallel embedding: its bf16 rows are the tensor-1 rows, bitwise.
  TrainConfig c = config("gpt");
  c.parallel.sequence = false;
  Stage one(model_of(c, TensorGroup{}), Device::cpu()), two(model_of(c, g), Device::cpu());
  ASSERT_STREQ(two.layer(0).type(), "VocabParallelEmbedding");
  const std::int64_t n = 2, t = c.data.seq_len;
  Tensor ids = Tensor::empty({n, t});
  for (std::int64_t i = 0; i < n * t; ++i) ids.data<float>()[i] = float(std::int64_t(counter_uniform(9, 0, std::uint64_t(i)) * 256) % 256);
  const Tensor a = one.layer(0).forward(ids, Mode::eval), b = two.layer(0).forward(ids, Mode::eval);
  ASSERT_EQ(b.dtype(), DType::bf16);
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << "the split vocabulary's bf16 embedding";
}

// Tolerances on |loss - 1-rank bf16 loss| per step, about 10x the largest
// difference measured over the 10 steps at 2 and 4 ranks (printed per layout;
// the same at both rank counts):
//  - data parallelism (alone, ZeRO-1/2/3): every sample's activations are the
//    1-rank ones, only the float32 gradient sums differ in order: measured
//    4.4e-16 (vit), 1.3e-10 (gpt), 8.9e-16 (layers);
//  - tensor parallelism (tensor 2, + sequence, x data 2, x pipeline 2): the row
//    layers round their partial products to bf16 before the float32 sum, where
//    the 1-rank Linear rounds once, and the runs drift apart over the steps:
//    measured 1.4e-3 (vit), 5.4e-4 (gpt), 3.0e-3 (layers), with and without
//    sequence parallelism alike. For scale, the tensor-2 bf16 run is 2.1e-3,
//    9.8e-4 and 3.2e-3 from the tensor-2 fp32 run: two bf16 runs whose
//    roundings differ drift apart about as far as bf16 from fp32 in 10 steps.
struct Tolerance {
  const char* model;
  double data, tensor;
};
constexpr Tolerance kTolerances[] = {{"vit", 5e-15, 1.5e-2}, {"gpt", 1.5e-9, 5e-3}, {"layers", 1e-14, 3e-2}};

TEST_F(Bf16Layouts, LayoutsFollowTheOneRankBf16Run) {
  const int w = world_.size();
  if (w != 2 && w != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  Communicator self = world_.split(world_.rank(), 0, "self");
  for (const Tolerance& k : kTolerances) {
    const std::string model = k.model;
    const double data_tol = k.data, tensor_tol = k.tensor;
    const TrainConfig c = config(model);
    const std::int64_t batch = c.data.batch_size;  // the global batch of every layout
    const std::vector<double> ref = train_losses(c, self);
    ASSERT_EQ(ref.size(), std::size_t(kSteps)) << model;
    EXPECT_LT(ref.back(), ref.front()) << model << ": the 1-rank bf16 run learns";
    auto run = [&](const TrainConfig& t, const std::string& layout, double tol) {
      const std::vector<double> got = train_losses(t, world_);
      expect_follows(got, ref, cat(model, " ", layout), tol);
      return got;
    };
    // Tensor 2 (x data 2 at 4 ranks), with and without sequence parallelism.
    TrainConfig tp = c;
    tp.parallel.tensor = 2;
    tp.parallel.sequence = false;
    tp.data.batch_size = batch / (w / 2);
    const std::string tname = w == 2 ? "tensor 2" : "tensor 2 x data 2";
    const std::vector<double> b16 = run(tp, tname, tensor_tol);
    if (model != "layers") {  // no transformer blocks there: nothing to split by tokens
      TrainConfig sp = tp;
      sp.parallel.sequence = true;
      run(sp, tname + " + sequence", tensor_tol);
    }
    // bf16 really ran at tensor 2: not the fp32 run's losses.
    const std::vector<double> f32 = train_losses(with_precision(tp, "fp32"), world_);
    EXPECT_NE(b16, f32) << model << " " << tname << ": the bf16 run is bitwise the fp32 run";
    double gap = 0;
    for (std::size_t i = 0; i < f32.size() && i < b16.size(); ++i) gap = std::max(gap, std::fabs(b16[i] - f32[i]));
    if (world_.rank() == 0) std::printf("[bf16 layouts] %s %s: bf16 vs fp32 max |loss difference| %.2e\n", model.c_str(), tname.c_str(), gap);
    if (w == 4) {
      TrainConfig pp = c;  // tensor 2 x pipeline 2, 2 micro-batches
      pp.parallel.tensor = 2;
      pp.parallel.pipeline = 2;
      pp.parallel.micro_batches = 2;
      run(pp, "tensor 2 x pipeline 2", tensor_tol);
    }
    // Data w, alone and with ZeRO-1, 2 and 3.
    TrainConfig dp = c;
    dp.data.batch_size = batch / w;
    for (int zero : {0, 1, 2, 3}) {
      TrainConfig z = dp;
      z.parallel.zero = zero;
      run(z, cat("data ", w, zero ? cat(" + ZeRO-", zero) : std::string()), data_tol);
    }
  }
}
