#pragma once
// A model described as data: `model.name = "layers"` and a `[[model.layers]]`
// list in the job's TOML (docs/own_model_toml.md). Each entry is ONE top-level
// layer (a residual or transformer block is one entry with nested layers), so
// a pipeline partitions the list as written.
//
// Rules:
//  - Input sizes are inferred: each entry sees the output shape of the one
//    before it (the data's [C, H, W] first); only output sizes are written.
//  - Parameter names are "<name>.weight" etc.; the default name is
//    "<type><index>". Initial values are keyed by parameter name, so an entry
//    named like a built-in model's layer starts from the same numbers.
//  - Every error names the entry (model.layers[i], nested: [i].layers[j]),
//    the key and, for shapes, the shape that does not fit. Every rank builds
//    the model, so every rank raises the same error.
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "ringtrain/nn/layer.hpp"
#include "ringtrain/nn/tensor_group.hpp"

namespace ringtrain {

struct ModelConfig;

// One [[model.layers]] entry as written: type, options, nested lists.
struct LayerDesc {
  using Value = std::variant<std::int64_t, double, bool, std::string>;
  std::string type;
  std::vector<std::pair<std::string, Value>> options;  // every key but type/layers/shortcut (sorted by key)
  std::vector<LayerDesc> layers;    // residual: the body
  std::vector<LayerDesc> shortcut;  // residual: the projection (empty = identity)
  bool operator==(const LayerDesc&) const = default;
};

// Keys and types of every entry, without shapes (config validation);
// throws Error naming model.layers[i] and the key.
void check_layer_descs(const std::vector<LayerDesc>& layers);

// The top-level layers `descs` describe, for cfg's data shape, cfg.classes
// and cfg.tensor (a built-in model is such a list too, models.cpp). `where`
// names the list in errors ("model.layers"); the last entry must give one
// score per class. fuse_pool: the backend fuses max pooling into the
// convolution (else a conv's `pool` becomes its own layer "<name>_pool").
std::vector<LayerPtr> build_described_layers(const std::vector<LayerDesc>& descs, const ModelConfig& cfg,
                                             bool fuse_pool, const std::string& where);
// One entry, built for input samples of shape `sample` (without the batch:
// [C, H, W] or [T, D]) and the tensor group g; it must be one layer.
LayerPtr build_described_layer(const LayerDesc& d, const Shape& sample, const TensorGroup& g, bool fuse_pool);

// The top-level layers of a `layers` model for cfg (cfg.layers).
std::vector<LayerPtr> layers_model(const ModelConfig& cfg, bool fuse_pool);

}  // namespace ringtrain
