#pragma once
// Models of the user's own, by name. A program registers a builder before it
// trains, then uses the name like a built-in one (model.name in TOML, --model,
// build_model_layers, Trainer), e.g.
//   ringtrain::register_model("mynet", build_mynet);
//   return ringtrain::main(argc, argv);   // ringtrain/cli/main.hpp
// docs/custom_model.md walks through examples/custom_model.
//
// What a builder must keep (every layout runs the same model from it):
//  - It returns the model's TOP-LEVEL layers, freshly constructed, neither
//    registered nor bound (ringtrain registers, allocates, binds and
//    initialises them). It is called many times and on every rank (pipeline
//    stages build the list once per activation slot and keep their own range;
//    the partition plans from it), so it must be deterministic: the same
//    ModelConfig gives the same layers, with no collectives and no side effects.
//  - Usable layers: everything in nn/layers.hpp (Linear, Conv2d, BatchNorm2d,
//    Activation, Pool2d, Dropout, Flatten, Sequential, Residual, basic_block),
//    nn/transformer.hpp (LayerNorm, MultiHeadSelfAttention, PatchEmbed,
//    TokenMean, ResidualStack, transformer_block) and the tensor-parallel
//    layers below. The output is [N, classes] logits for the softmax
//    cross-entropy loss. A list of LayerDesc entries built by
//    build_described_layers (nn/layers_model.hpp) is a model too.
//  - A pipeline (parallel.pipeline = P) partitions the top-level list into P
//    contiguous ranges: a top-level layer is never split, so a residual block
//    (Residual / Sequential) stays whole on one stage. Give the model at least P
//    top-level layers and unique top-level names.
//  - Tensor parallelism (parallel.tensor = T) applies where the builder uses
//    cfg.tensor: split_layer (column- or row-parallel Linear / Conv2d,
//    nn/tensor_parallel.hpp), ChannelParallelBatchNorm2d, and basic_block,
//    transformer_block, multi_head_attention given the group. Layers built
//    without cfg.tensor are replicated on the T ranks. The split sizes must be
//    divisible by cfg.tensor.size (check_tensor_divides gives a clear error).
//  - The same list for every layout: the number, order and names of the
//    top-level layers and of their parameters must not depend on cfg.tensor
//    (a ColumnParallel layer registers its shard of the same parameter the
//    Linear would). Initial values come from the counter RNG keyed by
//    (cfg.seed, parameter index, element index), so they equal the 1-rank
//    model's at every layout; a Layer subclass of its own must do the same.
//  - Errors: throw ringtrain::Error (RT_CHECK / RT_FAIL) naming the setting
//    that does not fit; every rank builds, so every rank reports it.
#include <functional>
#include <string>
#include <vector>

#include "ringtrain/nn/loss.hpp"
#include "ringtrain/nn/model.hpp"

namespace ringtrain {

using ModelBuilder = std::function<std::vector<LayerPtr>(const ModelConfig& cfg)>;
// The model's own loss (nn/loss.hpp), made once per run on every rank; only
// the last pipeline stage calls it. Deterministic, like the builder.
using LossBuilder = std::function<LossPtr(const ModelConfig& cfg)>;

// Registers `builder` under `name` (call before training, e.g. first thing in
// main; thread-safe), with `loss` when the model trains on another loss than
// softmax cross-entropy. Throws Error for an empty name, a built-in name
// (builtin_model_names()), a name registered before, or an empty builder.
void register_model(const std::string& name, ModelBuilder builder, LossBuilder loss = {});
bool is_registered_model(const std::string& name);
std::vector<std::string> registered_model_names();  // sorted

// The built-in models' names (those models.cpp dispatches itself) and every
// name a configuration may use (built-in, then registered), as "mlp, cnn, ...".
const std::vector<std::string>& builtin_model_names();
bool is_builtin_model(const std::string& name);
bool is_known_model(const std::string& name);
std::string known_model_list();

// The registered model's top-level layers for cfg (cfg.name names it); errors
// name the model (an unknown name lists the known ones).
std::vector<LayerPtr> build_registered_model(const ModelConfig& cfg);

// The loss a model of cfg trains on, given the last layer of the model (null:
// this rank's stage does not end the model): the registered model's own, else
// what that layer asks for (Layer::output_loss: a vocabulary-split head), else
// softmax cross-entropy. Throws Error naming the model when its builder fails.
LossPtr model_loss(const ModelConfig& cfg, const Layer* last);

}  // namespace ringtrain
