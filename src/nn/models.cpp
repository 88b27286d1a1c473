// The model zoo: mlp, cnn, resnet (ResNet-20 style) and vit (a vision
// transformer), each written ONCE as a description (layers_model.hpp's
// entries, what a [[model.layers]] list holds) whose split layers carry their
// tensor-parallel plan (tensor = "column" / "row"). The one builder
// (layers_model.cpp) turns it into this rank's layers: ordinary ones at
// parallel.tensor = 1, shards at T > 1, with the same parameter names,
// registration order and initial values. Checks that name configuration keys
// run first, so a bad size is reported by its key.
// ReLUs (and in `cnn` the max pooling) that directly follow a Conv2d or
// Linear are fused into it (the backend then applies them in the same pass and
// keeps the large intermediate in its preferred layout); the math is unchanged.
#include <algorithm>
#include <cmath>

#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/nn/model_registry.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"

namespace ringtrain {
namespace {

// One entry, written as a TOML table would be: Entry("conv", "conv1").i("out", 32)...
class Entry {
 public:
  Entry(const char* type, const std::string& name) {
    d_.type = type;
    d_.options.emplace_back("name", name);
  }
  Entry& i(const char* key, std::int64_t v) { return set(key, v); }
  Entry& f(const char* key, double v) { return set(key, v); }
  Entry& b(const char* key, bool v) { return set(key, v); }
  Entry& s(const char* key, const std::string& v) { return set(key, v); }
  Entry& column() { return set("tensor", std::string("column")); }
  Entry& row() { return set("tensor", std::string("row")); }
  Entry& layers(std::vector<LayerDesc> l) {
    d_.layers = std::move(l);
    return *this;
  }
  Entry& shortcut(std::vector<LayerDesc> l) {
    d_.shortcut = std::move(l);
    return *this;
  }
  operator LayerDesc() const {  // options sorted by key, as the TOML reader keeps them
    LayerDesc d = d_;
    std::sort(d.options.begin(), d.options.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    return d;
  }

 private:
  Entry& set(const char* key, LayerDesc::Value v) {
    d_.options.emplace_back(key, std::move(v));
    return *this;
  }
  LayerDesc d_;
};

// flatten -> fc1 (column) -> fc2 (row) -> [dropout] -> fc3: one all-reduce each way.
std::vector<LayerDesc> mlp(const ModelConfig& c) {
  check_tensor_divides(256, "the hidden width of fc1", c.tensor, "mlp");
  std::vector<LayerDesc> L = {Entry("flatten", "flatten"),
                              Entry("linear", "fc1").i("out", 256).b("relu", true).column(),
                              Entry("linear", "fc2").i("out", 128).b("relu", true).row()};
  if (c.dropout > 0) L.push_back(Entry("dropout", "dropout").f("p", c.dropout));
  L.push_back(Entry("linear", "fc3").i("out", c.classes));
  return L;
}

// conv1 column (ReLU, pooling local) -> conv2 row (bias, ReLU, pooling after
// the reduction) -> flatten -> fc1 column (ReLU) -> [dropout on its shard of
// the unsplit mask] -> fc2 row: two all-reduces forward, two backward.
std::vector<LayerDesc> cnn(const ModelConfig& c) {
  RT_CHECK(c.height >= 4 && c.width >= 4, "model 'cnn': input must be at least 4x4, got ", c.height, "x", c.width);
  check_tensor_divides(32, "the filter count of conv1", c.tensor, "cnn");
  check_tensor_divides(128, "the output width of fc1", c.tensor, "cnn");
  std::vector<LayerDesc> L = {
      Entry("conv", "conv1").i("out", 32).i("padding", 1).b("relu", true).i("pool", 2).column(),
      Entry("conv", "conv2").i("out", 64).i("padding", 1).b("relu", true).i("pool", 2).row(),
      Entry("flatten", "flatten"), Entry("linear", "fc1").i("out", 128).b("relu", true).column()};
  if (c.dropout > 0) L.push_back(Entry("dropout", "dropout").f("p", c.dropout));
  L.push_back(Entry("linear", "fc2").i("out", c.classes).row());
  return L;
}

// conv3x3(stride) column -> BN on its channels -> ReLU -> conv3x3 row -> BN
// (replicated), + the replicated shortcut (1x1 conv and BN when the shape
// changes), add, ReLU: one all-reduce per block each way.
LayerDesc basic_block_entry(const std::string& name, std::int64_t out, std::int64_t stride, bool project) {
  Entry e = Entry("residual", name).b("relu", true);
  e.layers({Entry("conv", "conv1").i("out", out).i("stride", stride).i("padding", 1).b("bias", false).column(),
            Entry("batchnorm", "bn1"), Entry("relu", "relu1"),
            Entry("conv", "conv2").i("out", out).i("padding", 1).b("bias", false).row(), Entry("batchnorm", "bn2")});
  if (project)
    e.shortcut({Entry("conv", "conv").i("out", out).i("kernel", 1).i("stride", stride).b("bias", false),
                Entry("batchnorm", "bn")});
  return e;
}

std::vector<LayerDesc> resnet(const ModelConfig& c) {
  RT_CHECK(c.depth >= 8 && (c.depth - 2) % 6 == 0, "model 'resnet': depth must be 6n+2 (20, 32, 44, 56, ...), got ",
           c.depth);
  RT_CHECK(c.base_width > 0, "model 'resnet': base_width must be positive, got ", c.base_width);
  check_tensor_divides(c.base_width, "model.width", c.tensor, "resnet");  // every stage's width is a multiple
  const int n = (c.depth - 2) / 6;
  const std::int64_t w = c.base_width;
  std::vector<LayerDesc> L = {Entry("conv", "conv1").i("out", w).i("padding", 1).b("bias", false),
                              Entry("batchnorm", "bn1"), Entry("relu", "relu")};
  std::int64_t in = w;
  for (int stage = 0; stage < 3; ++stage) {
    const std::int64_t out = w << stage;
    for (int b = 0; b < n; ++b) {
      const std::int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      L.push_back(basic_block_entry(cat("layer", stage + 1, ".", b), out, stride, stride != 1 || in != out));
      in = out;
    }
  }
  L.push_back(Entry("avgpool", "avgpool").b("global", true));
  L.push_back(Entry("flatten", "flatten"));
  if (c.dropout > 0) L.push_back(Entry("dropout", "dropout").f("p", c.dropout));
  L.push_back(Entry("linear", "fc").i("out", c.classes));
  return L;
}

// The vision transformer (Dosovitskiy et al. 2021, pre-norm blocks, a
// classifier on the mean token instead of a class token):
//   patch_embed (patches -> Linear, + learned position embedding)
//   blocks.0 .. blocks.{depth-1}   x + attn(norm1(x)), then x + fc2(gelu(fc1(norm2(x))))
//   norm (LayerNorm) -> pool (mean over tokens) -> head (Linear to the classes)
// Each block is one top-level layer, so gradients of a block are all-reduced
// while earlier blocks still compute backward, and a pipeline can cut between
// blocks. Over the tensor group a block splits its heads and its MLP.
std::vector<LayerDesc> vit(const ModelConfig& c) {
  const std::int64_t dim = c.base_width, p = c.patch;
  const TensorGroup& g = c.tensor;
  RT_CHECK(p > 0, "model 'vit': model.patch must be positive, got ", p);
  RT_CHECK(c.height % p == 0 && c.width % p == 0, "model 'vit': the ", c.height, "x", c.width,
           " images are not divisible into model.patch = ", p, " patches");
  RT_CHECK(c.heads > 0, "model 'vit': model.heads must be positive, got ", c.heads);
  RT_CHECK(dim > 0 && dim % c.heads == 0, "model 'vit': model.width = ", dim, " is not divisible by model.heads = ",
           c.heads);
  RT_CHECK(c.depth >= 1, "model 'vit': model.depth must be >= 1, got ", c.depth);
  RT_CHECK(c.mlp_ratio > 0 && c.mlp_ratio * double(dim) >= 1, "model 'vit': model.mlp_ratio must give at least one "
           "hidden unit, got ", c.mlp_ratio);
  const auto hidden = static_cast<std::int64_t>(std::llround(double(dim) * c.mlp_ratio));
  RT_CHECK(c.heads % g.size == 0, "model 'vit': model.heads = ", c.heads, " is not divisible by parallel.tensor = ",
           g.size, " (attention heads are split over the tensor ranks)");
  RT_CHECK(hidden % g.size == 0, "model 'vit': the MLP hidden width model.width * model.mlp_ratio = ", dim, " * ",
           c.mlp_ratio, " = ", hidden, " is not divisible by parallel.tensor = ", g.size);
  std::vector<LayerDesc> L = {Entry("patch_embed", "patch_embed").i("patch", p).i("out", dim)};
  for (int i = 0; i < c.depth; ++i)
    L.push_back(Entry("transformer", cat("blocks.", i))
                    .i("heads", c.heads)
                    .f("mlp_ratio", c.mlp_ratio)
                    .f("dropout", c.dropout)
                    .s("gelu", c.gelu)
                    .f("eps", c.layernorm_eps));
  L.push_back(Entry("layernorm", "norm").f("eps", c.layernorm_eps));
  L.push_back(Entry("token_mean", "pool"));
  L.push_back(Entry("linear", "head").i("out", c.classes));
  return L;
}

// A GPT-2-style language model (Radford et al. 2019) on token data:
//   wte (token + learned position embedding) -> [drop] ->
//   blocks.0 .. blocks.{depth-1} (pre-norm, causal attention, GELU MLP) ->
//   norm (LayerNorm) -> lm_head (logits: x wte.weight^T, the tied embedding)
// The blocks split their heads and MLP over the tensor group as in vit; the
// embedding and the head split the vocabulary (Megatron's vocabulary-parallel
// embedding, logits and loss) where parallel.tensor divides it, else they are
// replicated.
std::vector<LayerDesc> gpt(const ModelConfig& c) {
  const std::int64_t dim = c.base_width;
  RT_CHECK(c.seq_len > 0, "model 'gpt': needs token data (ringtrain prepare --dataset text|tokens); data.train "
           "holds images");
  RT_CHECK(c.heads > 0, "model 'gpt': model.heads must be positive, got ", c.heads);
  RT_CHECK(dim > 0 && dim % c.heads == 0, "model 'gpt': model.width = ", dim, " is not divisible by model.heads = ",
           c.heads);
  RT_CHECK(c.depth >= 1, "model 'gpt': model.depth must be >= 1, got ", c.depth);
  RT_CHECK(c.heads % c.tensor.size == 0, "model 'gpt': model.heads = ", c.heads,
           " is not divisible by parallel.tensor = ", c.tensor.size, " (attention heads are split over the tensor "
           "ranks)");
  const auto hidden = static_cast<std::int64_t>(std::llround(double(dim) * c.mlp_ratio));
  RT_CHECK(hidden > 0 && hidden % c.tensor.size == 0, "model 'gpt': the MLP hidden width model.width * "
           "model.mlp_ratio = ", hidden, " must be positive and divisible by parallel.tensor = ", c.tensor.size);
  RT_CHECK(c.experts >= 0 && c.moe_every >= 1, "model 'gpt': model.experts must be >= 0 and model.moe_every >= 1, "
           "got ", c.experts, " and ", c.moe_every);
  RT_CHECK(c.experts == 0 || (c.top_k >= 1 && c.top_k <= c.experts), "model 'gpt': model.top_k = ", c.top_k,
           " must be in [1, model.experts = ", c.experts, "]");
  RT_CHECK(c.experts % c.expert.size == 0, "model 'gpt': model.experts = ", c.experts,
           " is not divisible by parallel.expert = ", c.expert.size);
  std::vector<LayerDesc> L = {Entry("embedding", "wte").i("out", dim)};
  if (c.dropout > 0) L.push_back(Entry("dropout", "drop").f("p", c.dropout));
  for (int i = 0; i < c.depth; ++i) {
    Entry b = Entry("transformer", cat("blocks.", i))
                  .i("heads", c.heads)
                  .f("mlp_ratio", c.mlp_ratio)
                  .f("dropout", c.dropout)
                  .b("causal", true)
                  .s("gelu", c.gelu)
                  .f("eps", c.layernorm_eps);
    if (c.experts > 0 && (i + 1) % c.moe_every == 0)  // every moe_every-th block (the last of each run) has experts
      b.i("experts", c.experts).i("top_k", c.top_k).f("aux_loss_coeff", c.aux_loss_coeff)
          .f("capacity_factor", c.capacity_factor).f("bias_update_rate", c.moe_bias_update_rate);
    L.push_back(b);
  }
  L.push_back(Entry("layernorm", "norm").f("eps", c.layernorm_eps));
  L.push_back(Entry("lm_head", "lm_head").s("tie", "wte"));
  return L;
}

std::vector<LayerPtr> build_layers(const ModelConfig& c, bool fuse_pool) {
  RT_CHECK(c.in_channels > 0 && c.height > 0 && c.width > 0, "model '", c.name,
           "': in_channels, height and width must be positive");
  RT_CHECK(c.classes > 1, "model '", c.name, "': needs at least 2 classes, got ", c.classes);
  RT_CHECK(c.dropout >= 0 && c.dropout < 1, "model '", c.name, "': dropout must be in [0, 1), got ", c.dropout);
  // Not built in: a model the program registered, or an error listing every known name.
  if (!is_builtin_model(c.name)) return build_registered_model(c);
  if (c.name == "layers") return layers_model(c, fuse_pool);
  std::vector<LayerDesc> d;
  if (c.name == "mlp") d = mlp(c);
  else if (c.name == "cnn") d = cnn(c);
  else if (c.name == "resnet") d = resnet(c);
  else if (c.name == "vit") d = vit(c);
  else if (c.name == "gpt") d = gpt(c);
  else RT_FAIL("unknown model '", c.name, "' (known: mlp, cnn, resnet, vit, gpt, layers)");
  std::vector<LayerPtr> layers = build_described_layers(d, c, fuse_pool, cat("model '", c.name, "' layers"));
  if (c.context.size > 1) shard_context(layers, c.context);  // nn/context_parallel.hpp
  return layers;
}

}  // namespace

LayerPtr basic_block(const std::string& name, std::int64_t in_ch, std::int64_t out_ch, std::int64_t stride,
                     const TensorGroup& g) {
  // The block's layers do not depend on the image size: a 1x1 sample passes every shape check.
  return build_described_layer(basic_block_entry(name, out_ch, stride, stride != 1 || in_ch != out_ch),
                               {in_ch, 1, 1}, g, false);
}

std::vector<LayerPtr> build_model_layers(const ModelConfig& cfg, Device dev) {
  return build_layers(cfg, backend_for(dev).conv_fuses_pool());
}

std::vector<LayerPlan> plan_model_layers(const ModelConfig& cfg, Device dev) {
  std::vector<LayerPlan> out;
  ParamArena scratch;  // never finalised: registration records names and shapes only
  int i = 0;
  for (auto& l : build_layers(cfg, backend_for(dev).conv_fuses_pool())) {
    const std::size_t before = scratch.size();
    l->register_params(scratch, i++, "");
    LayerPlan p{l->name(), scratch.size() - before, 0};
    for (std::size_t k = before; k < scratch.size(); ++k) p.numel += shape_numel(scratch.info(k).shape);
    out.push_back(std::move(p));
  }
  return out;
}

double model_flops_per_sample(const ModelConfig& cfg) {
  Shape s = model_input_shape(cfg, 1);
  double f = 0;
  for (auto& l : build_layers(cfg, true)) {
    f += l->forward_flops(s);
    s = l->output_shape(s);
  }
  return 3.0 * f;  // backward = data + weight gradients, each about one forward
}

}  // namespace ringtrain
