// Tensor-parallel building blocks of the model zoo (mlp in models.cpp, vit in vit.cpp).
#include <cmath>

#include "ringtrain/nn/tensor_parallel.hpp"

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

}  // namespace ringtrain
