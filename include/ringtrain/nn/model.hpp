#pragma once
// The model a configuration names: ModelConfig, and its top-level layers,
// built fresh (neither registered nor bound). A pipeline stage
// (parallel/stage.hpp) registers, allocates, binds and initialises the range
// of them it runs; a Stage over every layer with one slot is the whole model.
//
// Rules:
//  - The built-in models (mlp, cnn, resnet, vit) are each one description
//    (layers_model.hpp's entries, as a [[model.layers]] list) with their
//    tensor-parallel plan; cfg.tensor of size 1 builds the ordinary layers.
//  - Layer i's parameters occupy a contiguous, ordered run of the parameters
//    (construction order), identical on every rank and at every layout.
#include <cstdint>
#include <string>
#include <vector>

#include "ringtrain/nn/context_parallel.hpp"
#include "ringtrain/nn/layer.hpp"
#include "ringtrain/nn/layers_model.hpp"
#include "ringtrain/nn/moe.hpp"
#include "ringtrain/nn/parameters.hpp"
#include "ringtrain/nn/tensor_group.hpp"

namespace ringtrain {

struct ModelConfig {
  std::string name = "cnn";     // mlp | cnn | resnet | vit | gpt | layers
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
  // bf16/fp16 activation storage where the backend offers it; the trainer turns it
  // off on a GPU until the validation gate lists it (train/gpu_gate.hpp).
  bool storage16 = true;
  TensorGroup tensor;              // parallel.tensor: every model splits its layers over it
  ContextGroup context;            // parallel.context: a language model splits its tokens over it (size 1: off)
  bool sequence = true;            // parallel.sequence: transformer blocks split their tokens over `tensor` too
  std::vector<LayerDesc> layers;   // name = layers: the [[model.layers]] entries (layers_model.hpp)
  std::string gelu = "erf";        // vit, gpt: the MLP's GELU, erf | tanh (GPT-2's approximation)
  double layernorm_eps = 1e-5;     // vit, gpt: every LayerNorm's epsilon
  // Token data (language models): the input is token ids [N, seq_len] and
  // `classes` is the vocabulary; 0: images [N, in_channels, height, width].
  std::int64_t seq_len = 0;
  // gpt: mixture of experts (nn/moe.hpp) in every moe_every-th block's MLP; 0 experts: dense.
  int experts = 0, top_k = 2, moe_every = 1;
  double aux_loss_coeff = 0.01, capacity_factor = 0;
  double moe_bias_update_rate = 0;  // aux-loss-free balancing (nn/moe.hpp); 0: off
  ExpertGroup expert;  // parallel.expert: the ranks splitting the experts
};

// The model's input for n samples: [n, seq_len] token ids, or [n, C, H, W] images.
inline Shape model_input_shape(const ModelConfig& c, std::int64_t n) {
  return c.seq_len > 0 ? Shape{n, c.seq_len} : Shape{n, c.in_channels, c.height, c.width};
}

// The top-level layers of mlp / cnn / resnet / vit / layers or a registered
// model (model_registry.hpp) for `dev`'s backend; throws Error naming unknown
// models or bad sizes (the configuration key where there is one).
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
