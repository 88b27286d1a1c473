// The vision transformer `vit` (Dosovitskiy et al. 2021, pre-norm blocks, a
// classifier on the mean token instead of a class token):
//   patch_embed (patches -> Linear, + learned position embedding)
//   blocks.0 .. blocks.{depth-1}   x + attn(norm1(x)), then x + fc2(gelu(fc1(norm2(x))))
//   norm (LayerNorm) -> pool (mean over tokens) -> head (Linear to the classes)
// Each block is one top-level layer, so gradients of a block are all-reduced
// while earlier blocks still compute backward, and a pipeline can cut between
// blocks. The keys are ModelConfig's (config keys model.width, model.heads,
// model.mlp_ratio, model.patch, model.depth); errors name the key.
#include "vit.hpp"

#include "ringtrain/nn/tensor_parallel.hpp"

namespace ringtrain {

std::vector<LayerPtr> vit_layers(const ModelConfig& c) {
  const std::int64_t dim = c.base_width, p = c.patch;
  RT_CHECK(p > 0, "model 'vit': model.patch must be positive, got ", p);
  RT_CHECK(c.height % p == 0 && c.width % p == 0, "model 'vit': the ", c.height, "x", c.width,
           " images are not divisible into model.patch = ", p, " patches");
  RT_CHECK(c.heads > 0, "model 'vit': model.heads must be positive, got ", c.heads);
  RT_CHECK(dim > 0 && dim % c.heads == 0, "model 'vit': model.width = ", dim, " is not divisible by model.heads = ",
           c.heads);
  RT_CHECK(c.depth >= 1, "model 'vit': model.depth must be >= 1, got ", c.depth);
  RT_CHECK(c.mlp_ratio > 0 && c.mlp_ratio * double(dim) >= 1, "model 'vit': model.mlp_ratio must give at least one "
           "hidden unit, got ", c.mlp_ratio);
  std::vector<LayerPtr> L;
  L.push_back(std::make_unique<PatchEmbed>("patch_embed", c.in_channels, c.height, c.width, p, dim));
  TransformerBlockSpec bs;
  bs.dim = dim;
  bs.heads = c.heads;
  bs.mlp_ratio = c.mlp_ratio;
  bs.dropout = c.dropout;
  for (int i = 0; i < c.depth; ++i)
    L.push_back(c.tensor.size > 1 ? tensor_parallel_block(cat("blocks.", i), bs, c.tensor)
                                   : transformer_block(cat("blocks.", i), bs));
  L.push_back(std::make_unique<LayerNorm>("norm", dim));
  L.push_back(std::make_unique<TokenMean>("pool"));
  L.push_back(std::make_unique<Linear>("head", LinearSpec{dim, c.classes, true, false}, Init::xavier_uniform));
  return L;
}

}  // namespace ringtrain
