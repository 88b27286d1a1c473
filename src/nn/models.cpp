// The model zoo: mlp, cnn, resnet (ResNet-20 style) and vit (vit.cpp), built by name,
// and the models programs register (model_registry.hpp).
// ReLUs (and in `cnn` the max pooling) that directly follow a Conv2d or
// Linear are fused into it (the backend then applies them in the same pass and
// keeps the large intermediate in its preferred layout); the math is unchanged.
#include <cmath>

#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/nn/model_registry.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"
#include "ringtrain/nn/tensor_parallel_conv.hpp"
#include "vit.hpp"

namespace ringtrain {
namespace {

LayerPtr linear(const char* name, std::int64_t in, std::int64_t out, bool relu) {
  LinearSpec s;
  s.in_features = in;
  s.out_features = out;
  s.fuse_relu = relu;
  return std::make_unique<Linear>(name, s, relu ? Init::kaiming_normal : Init::xavier_uniform);
}

LayerPtr conv(const char* name, std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, bool bias,
              bool relu) {
  Conv2dSpec s = Conv2dSpec::square(in, out, k, stride, bias);
  s.fuse_relu = relu;
  return std::make_unique<Conv2d>(name, s);
}

// Conv3x3 + ReLU + 2x2 max pooling: one layer (one kernel call) where the
// backend fuses pooling, else a Conv2d+ReLU layer and a Pool2d layer "pool<i>".
void conv_relu_pool(std::vector<LayerPtr>& L, int i, std::int64_t in, std::int64_t out, bool fuse_pool) {
  Conv2dSpec s;
  s.in_channels = in;
  s.out_channels = out;
  s.pad_h = s.pad_w = 1;
  s.fuse_relu = true;
  s.fuse_pool = fuse_pool;
  L.push_back(std::make_unique<Conv2d>(cat("conv", i), s));
  if (!fuse_pool) L.push_back(std::make_unique<Pool2d>(cat("pool", i), Pool2dSpec{}));
}

std::vector<LayerPtr> build_layers(const ModelConfig& c, bool fuse_pool) {
  RT_CHECK(c.in_channels > 0 && c.height > 0 && c.width > 0, "model '", c.name,
           "': in_channels, height and width must be positive");
  RT_CHECK(c.classes > 1, "model '", c.name, "': needs at least 2 classes, got ", c.classes);
  RT_CHECK(c.dropout >= 0 && c.dropout < 1, "model '", c.name, "': dropout must be in [0, 1), got ", c.dropout);
  // Not built in: a model the program registered, or an error listing every known name.
  if (!is_builtin_model(c.name)) return build_registered_model(c);
  std::vector<LayerPtr> L;
  if (c.name == "mlp") {
    L.push_back(std::make_unique<Flatten>("flatten"));
    if (c.tensor.size > 1) {  // fc1 column-parallel, fc2 row-parallel: one all-reduce each way
      check_tensor_divides(256, "the hidden width of fc1", c.tensor, "mlp");
      const auto& g = c.tensor;
      L.push_back(std::make_unique<ColumnParallelLinear>(
          "fc1", LinearSpec{c.in_channels * c.height * c.width, 256, true, true}, Init::kaiming_normal, g));
      L.push_back(std::make_unique<RowParallelLinear>("fc2", LinearSpec{256, 128, true, true}, Init::kaiming_normal, g));
    } else {
      L.push_back(linear("fc1", c.in_channels * c.height * c.width, 256, true));
      L.push_back(linear("fc2", 256, 128, true));
    }
    if (c.dropout > 0) L.push_back(std::make_unique<Dropout>("dropout", c.dropout));
    L.push_back(linear("fc3", 128, c.classes, false));
  } else if (c.name == "cnn") {
    RT_CHECK(c.height >= 4 && c.width >= 4, "model 'cnn': input must be at least 4x4, got ", c.height, "x", c.width);
    if (c.tensor.size > 1) return tensor_parallel_cnn(c, fuse_pool);
    conv_relu_pool(L, 1, c.in_channels, 32, fuse_pool);
    conv_relu_pool(L, 2, 32, 64, fuse_pool);
    L.push_back(std::make_unique<Flatten>("flatten"));
    L.push_back(linear("fc1", 64 * (c.height / 2 / 2) * (c.width / 2 / 2), 128, true));
    if (c.dropout > 0) L.push_back(std::make_unique<Dropout>("dropout", c.dropout));
    L.push_back(linear("fc2", 128, c.classes, false));
  } else if (c.name == "resnet") {
    RT_CHECK(c.depth >= 8 && (c.depth - 2) % 6 == 0, "model 'resnet': depth must be 6n+2 (20, 32, 44, 56, ...), got ",
             c.depth);
    RT_CHECK(c.base_width > 0, "model 'resnet': base_width must be positive, got ", c.base_width);
    if (c.tensor.size > 1)  // every stage's width is a multiple of the first's
      check_tensor_divides(c.base_width, "model.width", c.tensor, "resnet");
    const int n = (c.depth - 2) / 6;
    const std::int64_t w = c.base_width;
    L.push_back(conv("conv1", c.in_channels, w, 3, 1, false, false));
    BatchNormSpec bs;
    bs.channels = w;
    L.push_back(std::make_unique<BatchNorm2d>("bn1", bs));
    L.push_back(std::make_unique<Activation>("relu", Eltwise::relu));
    std::int64_t in = w;
    for (int stage = 0; stage < 3; ++stage) {
      std::int64_t out = w << stage;
      for (int b = 0; b < n; ++b) {
        std::int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
        const std::string name = cat("layer", stage + 1, ".", b);
        L.push_back(c.tensor.size > 1 ? tensor_parallel_basic_block(name, in, out, stride, c.tensor)
                                       : basic_block(name, in, out, stride));
        in = out;
      }
    }
    L.push_back(std::make_unique<Pool2d>("avgpool", Pool2dSpec{}, true));
    L.push_back(std::make_unique<Flatten>("flatten"));
    if (c.dropout > 0) L.push_back(std::make_unique<Dropout>("dropout", c.dropout));
    L.push_back(linear("fc", in, c.classes, false));
  } else if (c.name == "vit") {
    L = vit_layers(c);
  } else if (c.name == "layers") {
    L = layers_model(c, fuse_pool);
  } else {
    RT_FAIL("unknown model '", c.name, "' (known: mlp, cnn, resnet, vit, layers)");
  }
  return L;
}

}  // namespace

std::unique_ptr<Model> build_model(const ModelConfig& cfg, Device dev) {
  auto m = std::make_unique<Model>(cfg.name, dev);
  for (auto& l : build_layers(cfg, backend_for(dev).conv_fuses_pool())) m->add(std::move(l));
  m->finalize({cfg.in_channels, cfg.height, cfg.width}, cfg.seed, cfg.math);
  return m;
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
  Shape s = {1, cfg.in_channels, cfg.height, cfg.width};
  double f = 0;
  for (auto& l : build_layers(cfg, true)) {
    f += l->forward_flops(s);
    s = l->output_shape(s);
  }
  return 3.0 * f;  // backward = data + weight gradients, each about one forward
}

}  // namespace ringtrain
