// Channel-split tensor-parallel layers (nn/tensor_parallel.hpp: the column-
// and row-parallel layers over a Conv2d, the channel-split BatchNorm; and the
// row-parallel layer over a Linear on tokens) at
// T = the world size: each layer's forward output, input gradient and
// parameter gradients equal the unsplit layer's (its channel part where the
// quantity is split) within 1e-5, starting from the unsplit layer's initial
// values; and the channel-sharded BatchNorm's running statistics are its
// part of the whole layer's. The models built from them (cnn, resnet) are
// checked against the 1-rank model in mpi_tensor_parallel.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "../support/error_of.hpp"
#include "ringtrain/nn/rng.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"

namespace ringtrain {
namespace {

using test_support::error_of;

Tensor values(const Shape& s, std::uint64_t stream) {  // the same on every rank
  Tensor t = Tensor::empty(s, DType::f32);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 2.f * counter_uniform(5, stream, i) - 1.f;
  return t;
}

// One layer with its own arena, bound and initialised as a Stage does.
struct Built {
  ParamArena arena;
  LayerPtr layer;
  explicit Built(LayerPtr l) : layer(std::move(l)) {
    layer->register_params(arena, 0, "");
    arena.finalize(Device::cpu());
    BindContext ctx{backend_for(Device::cpu()), Device::cpu(), arena, 7};
    layer->bind(ctx);
    layer->init(arena, 7);
  }
};

// Channel part of a whole NCHW tensor (or of a [C] vector when dim = 0).
Tensor part(const Tensor& whole, int dim, const TensorGroup& g) {
  return shard_of(whole, make_shard(whole.shape(), dim, g.size, g.rank));
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const float a = got.data<float>()[i], b = want.data<float>()[i];
    ASSERT_NEAR(a, b, 1e-5 * (1 + std::abs(b))) << what << "[" << i << "]";
  }
}

// Every parameter and its gradient against the whole layer's (its part when sharded).
void expect_params_and_grads(const Built& mine, const Built& whole, const std::string& what) {
  ASSERT_EQ(mine.arena.size(), whole.arena.size()) << what;
  for (std::size_t i = 0; i < mine.arena.size(); ++i) {
    const ShardSpec& s = mine.arena.info(i).shard;
    Tensor p = whole.arena.param(i), gr = whole.arena.grad(i);
    if (s.sharded()) p = shard_of(p, s), gr = shard_of(gr, s);
    expect_close(mine.arena.param(i), p, what + " " + mine.arena.info(i).name);
    expect_close(mine.arena.grad(i), gr, what + " d" + mine.arena.info(i).name);
  }
}

Conv2dSpec spec(std::int64_t in, std::int64_t out, std::int64_t stride, bool bias, bool relu, bool pool) {
  Conv2dSpec s;
  s.in_channels = in;
  s.out_channels = out;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = 1;
  s.bias = bias;
  s.fuse_relu = relu;
  s.fuse_pool = pool;
  return s;
}

TEST(ColumnParallelConv2d, EqualsTheWholeConvolutionsChannelPart) {
  const TensorGroup g = TensorGroup::of(Communicator::world());
  const std::int64_t T = g.size;
  for (bool fused : {false, true}) {
    const Conv2dSpec s = spec(3, 2 * T, fused ? 1 : 2, true, fused, fused);
    Built whole(std::make_unique<Conv2d>("conv", s)),
        mine(std::make_unique<ColumnParallel>("conv", s, Init::kaiming_normal, g));
    const std::string what = cat("column conv fused ", fused, " T ", T);
    Tensor x = values({4, 3, 6, 6}, 1);
    Tensor yw = whole.layer->forward(x, Mode::train), ym = mine.layer->forward(x, Mode::train);
    expect_close(ym, part(yw, 1, g), what + " y");
    Tensor dy = values(yw.shape(), 2);
    Tensor dxw = whole.layer->backward(dy, true, false), dxm = mine.layer->backward(part(dy, 1, g), true, false);
    expect_close(dxm, dxw, what + " dx (all-reduced)");
    expect_params_and_grads(mine, whole, what);
  }
}

TEST(RowParallelConv2d, EqualsTheWholeConvolutionAfterTheReduction) {
  const TensorGroup g = TensorGroup::of(Communicator::world());
  const std::int64_t T = g.size;
  for (int variant = 0; variant < 3; ++variant) {  // plain; bias + ReLU; bias + ReLU + max pooling
    const Conv2dSpec s = spec(2 * T, 5, 1, variant > 0, variant > 0, variant > 1);
    Built whole(std::make_unique<Conv2d>("conv", s)),
        mine(std::make_unique<RowParallel>("conv", s, Init::kaiming_normal, g));
    const std::string what = cat("row conv variant ", variant, " T ", T);
    // A nonzero bias, so that adding it once (after the reduction) is tested.
    if (s.bias) {
      Tensor b = values({5}, 9);
      Tensor bw = whole.arena.param(1), bm = mine.arena.param(1);
      bw.copy_from(b), bm.copy_from(b);
    }
    Tensor x = values({3, 2 * T, 6, 6}, 3);
    Tensor yw = whole.layer->forward(x, Mode::train), ym = mine.layer->forward(part(x, 1, g), Mode::train);
    expect_close(ym, yw, what + " y");
    Tensor dy = values(yw.shape(), 4);
    Tensor dxw = whole.layer->backward(dy, true, false), dxm = mine.layer->backward(dy, true, false);
    expect_close(dxm, part(dxw, 1, g), what + " dx");
    expect_params_and_grads(mine, whole, what);
    // accumulate = true adds a second gradient (the micro-batch path).
    whole.layer->forward(x, Mode::train), mine.layer->forward(part(x, 1, g), Mode::train);
    whole.layer->backward(dy, true, true), mine.layer->backward(dy, true, true);
    expect_params_and_grads(mine, whole, what + " accumulated");
  }
}

// The same row-parallel layer over a Linear on tokens [N, T, D] (bias over the
// last dimension, then the ReLU the mlp's fc2 fuses), after the reduction.
TEST(RowParallelLinear, EqualsTheWholeLinearOnTokensAfterTheReduction) {
  const TensorGroup g = TensorGroup::of(Communicator::world());
  const std::int64_t T = g.size;
  for (bool relu : {false, true}) {
    const LinearSpec s{2 * T, 5, true, relu};
    Built whole(std::make_unique<Linear>("fc", s)),
        mine(std::make_unique<RowParallel>("fc", s, Init::kaiming_normal, g));
    const std::string what = cat("row linear relu ", relu, " T ", T);
    Tensor b = values({5}, 10);
    Tensor bw = whole.arena.param(1), bm = mine.arena.param(1);
    bw.copy_from(b), bm.copy_from(b);
    Tensor x = values({3, 4, 2 * T}, 11);
    Tensor yw = whole.layer->forward(x, Mode::train), ym = mine.layer->forward(part(x, 2, g), Mode::train);
    expect_close(ym, yw, what + " y");
    Tensor dy = values(yw.shape(), 12);
    Tensor dxw = whole.layer->backward(dy, true, false), dxm = mine.layer->backward(dy, true, false);
    expect_close(dxm, part(dxw, 2, g), what + " dx");
    expect_params_and_grads(mine, whole, what);
  }
}

TEST(ChannelParallelBatchNorm2d, NormalisesItsChannelsAsTheWholeLayer) {
  const TensorGroup g = TensorGroup::of(Communicator::world());
  const std::int64_t T = g.size, C = 2 * T;
  BatchNormSpec s;
  s.channels = C;
  Built whole(std::make_unique<BatchNorm2d>("bn", s)),
      mine(std::make_unique<ChannelParallelBatchNorm2d>("bn", s, g));
  for (std::size_t i = 0; i < 2; ++i) {
    const ShardSpec& sh = mine.arena.info(i).shard;
    ASSERT_TRUE(sh.sharded());
    EXPECT_EQ(sh.global, (Shape{C}));
  }
  Tensor x = values({4, C, 3, 3}, 5), dy = values({4, C, 3, 3}, 6);
  for (int step = 0; step < 2; ++step) {
    Tensor yw = whole.layer->forward(x, Mode::train), ym = mine.layer->forward(part(x, 1, g), Mode::train);
    expect_close(ym, part(yw, 1, g), cat("bn y step ", step));
    Tensor dxw = whole.layer->backward(dy, true, false), dxm = mine.layer->backward(part(dy, 1, g), true, false);
    expect_close(dxm, part(dxw, 1, g), cat("bn dx step ", step));
    expect_params_and_grads(mine, whole, cat("bn step ", step));
  }
  auto bw = whole.layer->buffers(), bm = mine.layer->buffers();
  ASSERT_EQ(bw.size(), 2u);
  ASSERT_EQ(bm.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(bm[i].name, bw[i].name);
    ASSERT_TRUE(bm[i].shard.sharded()) << bm[i].name;  // checkpoints gather it whole
    expect_close(bm[i].tensor, shard_of(bw[i].tensor, bm[i].shard), bm[i].name);
    expect_close(gather_whole(bm[i].tensor, bm[i].shard, g), bw[i].tensor, bm[i].name + " gathered");
  }
  Tensor ye = whole.layer->forward(x, Mode::eval), ym = mine.layer->forward(part(x, 1, g), Mode::eval);
  expect_close(ym, part(ye, 1, g), "bn eval (running statistics)");
}

TEST(ShardedDropout, KeepsTheWholeMasksPart) {
  const TensorGroup g = TensorGroup::of(Communicator::world());
  auto whole = std::make_unique<Dropout>("dropout", 0.5);
  auto mine = std::make_unique<Dropout>("dropout", 0.5);
  mine->shard_features(g.size, g.rank);
  Built bw(std::move(whole)), bm(std::move(mine));
  Tensor x = values({3, 4 * g.size}, 8);
  Tensor yw = bw.layer->forward(x, Mode::train), ym = bm.layer->forward(part(x, 1, g), Mode::train);
  expect_close(ym, part(yw, 1, g), "dropout y");
  int zeros = 0;
  for (std::int64_t i = 0; i < yw.numel(); ++i) zeros += yw.data<float>()[i] == 0.f;
  EXPECT_GT(zeros, 0);  // the mask is not trivial
  Tensor dy = values(yw.shape(), 9);
  expect_close(bm.layer->backward(part(dy, 1, g), true, false), part(bw.layer->backward(dy, true, false), 1, g),
               "dropout dx");
}

TEST(TensorParallelConvErrors, ChannelCountsTheTensorSizeDoesNotDivideNameTheLayer) {
  TensorGroup g;
  g.size = 3;  // checked at construction, before any communication
  EXPECT_NE(error_of([&] { ColumnParallel("c", spec(2, 4, 1, true, false, false), Init::kaiming_normal, g); })
                .find("ColumnParallelConv2d 'c': 4 filters are not divisible by the tensor size 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { RowParallel("r", spec(4, 4, 1, true, false, false), Init::kaiming_normal, g); })
                .find("RowParallelConv2d 'r': 4 input channels are not divisible by the tensor size 3"),
            std::string::npos);
  BatchNormSpec s;
  s.channels = 4;
  EXPECT_NE(error_of([&] { ChannelParallelBatchNorm2d("bn", s, g); })
                .find("ChannelParallelBatchNorm2d 'bn': 4 channels are not divisible by the tensor size 3"),
            std::string::npos);
}

}  // namespace
}  // namespace ringtrain
