// Tensor-parallel building blocks of the model zoo (mlp in models.cpp, vit in
// vit.cpp, cnn and resnet in models.cpp). Layer names and registration order
// are the 1-rank model's, so parameters, checkpoints and initial values match.
#include <cmath>

#include "ringtrain/nn/tensor_parallel.hpp"
#include "ringtrain/nn/tensor_parallel_conv.hpp"

namespace ringtrain {

LayerPtr tensor_parallel_block(const std::string& name, const TransformerBlockSpec& s, const TensorGroup& g) {
  const auto hidden = static_cast<std::int64_t>(std::llround(double(s.dim) * s.mlp_ratio));
  RT_CHECK(s.heads % g.size == 0, "model 'vit': model.heads = ", s.heads, " is not divisible by parallel.tensor = ",
           g.size, " (attention heads are split over the tensor ranks)");
  RT_CHECK(hidden % g.size == 0, "model 'vit': the MLP hidden width model.width * model.mlp_ratio = ", s.dim, " * ",
           s.mlp_ratio, " = ", hidden, " is not divisible by parallel.tensor = ", g.size);
  const std::int64_t hd = s.dim / s.heads;
  std::vector<LayerPtr> attn, mlp;
  attn.push_back(std::make_unique<LayerNorm>("norm1", s.dim));
  attn.push_back(std::make_unique<MultiHeadSelfAttention>(
      "attn", s.heads / g.size, hd,
      std::make_unique<ColumnParallelLinear>("qkv", LinearSpec{s.dim, 3 * s.dim, true, false}, Init::xavier_uniform, g,
                                             3),
      std::make_unique<RowParallelLinear>("proj", LinearSpec{s.dim, s.dim, true, false}, Init::xavier_uniform, g)));
  if (s.dropout > 0) attn.push_back(std::make_unique<Dropout>(name + ".drop1", s.dropout));
  mlp.push_back(std::make_unique<LayerNorm>("norm2", s.dim));
  mlp.push_back(
      std::make_unique<ColumnParallelLinear>("fc1", LinearSpec{s.dim, hidden, true, false}, Init::xavier_uniform, g));
  mlp.push_back(std::make_unique<Activation>("gelu", Eltwise::gelu));
  mlp.push_back(
      std::make_unique<RowParallelLinear>("fc2", LinearSpec{hidden, s.dim, true, false}, Init::xavier_uniform, g));
  if (s.dropout > 0) mlp.push_back(std::make_unique<Dropout>(name + ".drop2", s.dropout));
  std::vector<std::vector<LayerPtr>> branches;
  branches.push_back(std::move(attn));
  branches.push_back(std::move(mlp));
  return std::make_unique<ResidualStack>(name, std::move(branches));
}


// conv1 column (ReLU, pooling local) -> conv2 row (bias, ReLU, pooling after
// the reduction) -> flatten -> fc1 column (ReLU) -> [dropout on its shard of
// the 1-rank mask] -> fc2 row: two all-reduces forward, two backward.
std::vector<LayerPtr> tensor_parallel_cnn(const ModelConfig& c, bool fuse_pool) {
  const TensorGroup& g = c.tensor;
  check_tensor_divides(32, "the filter count of conv1", g, "cnn");
  check_tensor_divides(128, "the output width of fc1", g, "cnn");
  std::vector<LayerPtr> L;
  Conv2dSpec s1 = Conv2dSpec::square(c.in_channels, 32, 3, 1, true), s2 = Conv2dSpec::square(32, 64, 3, 1, true);
  s1.fuse_relu = s2.fuse_relu = true;
  s1.fuse_pool = fuse_pool;  // else a Pool2d layer, as the 1-rank model
  s2.fuse_pool = true;       // the row layer pools after its reduction itself
  L.push_back(std::make_unique<ColumnParallelConv2d>("conv1", s1, Init::kaiming_normal, g));
  if (!fuse_pool) L.push_back(std::make_unique<Pool2d>("pool1", Pool2dSpec{}));
  L.push_back(std::make_unique<RowParallelConv2d>("conv2", s2, Init::kaiming_normal, g));
  L.push_back(std::make_unique<Flatten>("flatten"));
  L.push_back(std::make_unique<ColumnParallelLinear>(
      "fc1", LinearSpec{64 * (c.height / 4) * (c.width / 4), 128, true, true}, Init::kaiming_normal, g));
  if (c.dropout > 0) {
    auto d = std::make_unique<Dropout>("dropout", c.dropout);
    d->shard_features(g.size, g.rank);
    L.push_back(std::move(d));
  }
  L.push_back(std::make_unique<RowParallelLinear>("fc2", LinearSpec{128, c.classes, true, false},
                                                  Init::xavier_uniform, g));
  return L;
}

// conv1 column -> bn1 on its channels -> ReLU -> conv2 row -> bn2 (replicated),
// + the replicated shortcut: one all-reduce per block each way.
LayerPtr tensor_parallel_basic_block(const std::string& name, std::int64_t in_ch, std::int64_t out_ch,
                                     std::int64_t stride, const TensorGroup& g) {
  auto bn = [](std::int64_t ch) {
    BatchNormSpec s;
    s.channels = ch;
    return s;
  };
  std::vector<LayerPtr> body, shortcut;
  body.push_back(std::make_unique<ColumnParallelConv2d>("conv1", Conv2dSpec::square(in_ch, out_ch, 3, stride, false),
                                                        Init::kaiming_normal, g));
  body.push_back(std::make_unique<ChannelParallelBatchNorm2d>("bn1", bn(out_ch), g));
  body.push_back(std::make_unique<Activation>("relu1", Eltwise::relu));
  body.push_back(std::make_unique<RowParallelConv2d>("conv2", Conv2dSpec::square(out_ch, out_ch, 3, 1, false),
                                                     Init::kaiming_normal, g));
  body.push_back(std::make_unique<BatchNorm2d>("bn2", bn(out_ch)));
  if (stride != 1 || in_ch != out_ch) {
    shortcut.push_back(std::make_unique<Conv2d>("conv", Conv2dSpec::square(in_ch, out_ch, 1, stride, false)));
    shortcut.push_back(std::make_unique<BatchNorm2d>("bn", bn(out_ch)));
  }
  return std::make_unique<Residual>(name, std::move(body), std::move(shortcut), true);
}

}  // namespace ringtrain
