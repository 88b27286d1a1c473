#pragma once
// Internal to config.cpp: the [[model.layers]] list between TOML and LayerDesc.
#include <toml++/toml.h>

#include <string>
#include <vector>

#include "ringtrain/nn/layers_model.hpp"

namespace ringtrain {

// `node` is the value of model.layers; errors name the file, model.layers[i] and the key.
std::vector<LayerDesc> parse_layers_toml(const toml::node& node, const std::string& file);
// The list as [[model.layers]] tables (nested lists as inline tables); "" when empty.
std::string layers_to_toml(const std::vector<LayerDesc>& layers);

}  // namespace ringtrain
