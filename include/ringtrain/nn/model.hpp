#pragma once
// Model: an ordered list of top-level layers over one ParamArena on one device.
//
// Rules:
//  - Layer i's parameters occupy a contiguous, ordered run of the arena
//    (construction order), identical on every rank.
//  - backward() walks the layers in reverse and calls on_ready(i, params of i)
//    right after layer i's gradients are complete: the fusion engine enqueues
//    all-reduces from this hook while earlier layers still compute. Layers
//    without parameters are not reported. On the CPU the gradients are final
//    when the hook runs; on asynchronous devices their kernels are enqueued on
//    the backend's stream (see Backend::synchronize).
//  - Gradients accumulate into the arena unless zero_grad() was called since
//    the last backward (zero_grad lets the first backward overwrite instead of
//    adding, which saves a pass); arena().zero_grads() also works.
//  - forward() outputs are owned by the layers and valid until the next forward.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/nn/layer.hpp"
#include "ringtrain/nn/layers_model.hpp"
#include "ringtrain/nn/parameters.hpp"
#include "ringtrain/nn/tensor_group.hpp"

namespace ringtrain {

// on_ready(layer index, arena indices of that layer's parameters).
using GradReadyFn = std::function<void(int layer, std::span<const std::size_t> params)>;

struct ModelConfig {
  std::string name = "cnn";     // mlp | cnn | resnet | vit | layers
  std::int64_t in_channels = 1;
  std::int64_t height = 28, width = 28;
  std::int64_t classes = 10;
  int depth = 20;               // resnet: 6n + 2
  std::int64_t base_width = 16; // resnet: channels of the first stage (16, 32, 64)
  double dropout = 0.0;         // mlp/cnn: dropout before the last Linear when > 0; vit: in every block
  std::int64_t heads = 4;       // vit: attention heads (base_width = embedding width, depth = blocks)
  double mlp_ratio = 4.0;       // vit: MLP hidden units per embedding unit
  std::int64_t patch = 4;       // vit: square patch side; must divide height and width
  std::uint64_t seed = 42;      // initialisation and dropout
  MathMode math = MathMode::fp32;  // down-conversion allowed inside Conv2d/Linear (backend.hpp)
  TensorGroup tensor;              // parallel.tensor: every model splits its layers over it
  std::vector<LayerDesc> layers;   // name = layers: the [[model.layers]] entries (layers_model.hpp)
};

class Model {
 public:
  Model(std::string name, Device dev);
  ~Model();

  // Building: add layers, then finalize() registers, allocates and initialises.
  void add(LayerPtr layer);
  // sample_shape without batch, e.g. {1,28,28}; math: see MathMode.
  void finalize(const Shape& sample_shape, std::uint64_t seed, MathMode math = MathMode::fp32);

  Tensor forward(const Tensor& x, Mode mode);
  void backward(const Tensor& dlogits, const GradReadyFn& on_ready = {});
  void zero_grad();
  // Re-initialises parameters and buffers from a seed (same as at finalize).
  void reset_parameters(std::uint64_t seed);

  const std::string& name() const { return name_; }
  Device device() const { return device_; }
  ParamArena& arena() { return arena_; }
  const ParamArena& arena() const { return arena_; }
  std::int64_t num_params() const { return arena_.numel(); }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  Layer& layer(int i) { return *layers_.at(static_cast<std::size_t>(i)); }
  std::vector<std::string> layer_names() const;
  const Shape& sample_shape() const { return sample_shape_; }
  Shape output_shape(std::int64_t batch) const;
  // Running statistics etc. in a fixed order (empty for models without BN).
  std::vector<NamedBuffer> buffers() const;
  std::string summary() const;  // one line per layer: name, type, output shape, params

  // Binary checkpoint of parameters and buffers: magic, names, shapes, raw
  // bytes; loading checks every name and shape and restores bits exactly.
  void save(std::ostream& os) const;
  void load(std::istream& is);
  void save(const std::string& path) const;
  void load(const std::string& path);

 private:
  std::string name_;
  Device device_;
  Backend* backend_ = nullptr;
  ParamArena arena_;
  std::vector<LayerPtr> layers_;
  Shape sample_shape_;
  bool finalized_ = false;
  std::size_t first_param_layer_ = 0;  // backward stops here (earlier layers have no parameters)
  bool grads_zero_ = true;  // arena grads known to be zero: backward may overwrite
};

// Builds mlp / cnn / resnet / vit or a registered model (model_registry.hpp) on
// `dev`; throws Error naming unknown models or bad sizes.
std::unique_ptr<Model> build_model(const ModelConfig& cfg, Device dev = Device::cpu());
// The same model's top-level layers, unregistered and unbound (pipeline stages
// build their own copies of a contiguous range of them).
std::vector<LayerPtr> build_model_layers(const ModelConfig& cfg, Device dev = Device::cpu());
// What each top-level layer registers, found without allocating anything: a
// pipeline stage sizes and places itself with it (parameter counts for the
// partition, the model index of its first parameter) instead of building the
// whole model. numel counts this rank's shard of tensor-parallel parameters.
struct LayerPlan {
  std::string name;
  std::size_t params = 0;     // registered parameters (arena entries)
  std::int64_t numel = 0;     // their elements
};
std::vector<LayerPlan> plan_model_layers(const ModelConfig& cfg, Device dev = Device::cpu());
// Forward+backward FLOPs per sample of conv and linear layers (for GFLOP/s).
double model_flops_per_sample(const ModelConfig& cfg);

}  // namespace ringtrain
