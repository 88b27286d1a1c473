#pragma once
// Internal to the model zoo: the layers of `vit` (vit.cpp).
#include <vector>

#include "ringtrain/nn/model.hpp"

namespace ringtrain {

std::vector<LayerPtr> vit_layers(const ModelConfig& c);

}  // namespace ringtrain
