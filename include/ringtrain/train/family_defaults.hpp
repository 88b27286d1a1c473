// Defaults by model family: gpt and vit train with AdamW, not the cnn's SGD at 0.05
// (TrainConfig's built-in defaults). They fill only the keys that neither the
// configuration file nor the command line gives: a key the user set always wins.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/train/config.hpp"

namespace ringtrain {

// The family's (key, value) pairs for model.name = `model` at model.width = `width` (the
// learning rate goes as 1/width); empty for the other models (the built-in defaults are theirs).
std::vector<std::pair<std::string, std::string>> family_defaults(const std::string& model, std::int64_t width);

// The section.key names a TOML file and `section.key=value` overrides give.
std::set<std::string> given_keys(const std::string& toml_path, const std::vector<std::string>& sets);

// Applies family_defaults(cfg.model.name, cfg.model.width) to every key not in `given` (none
// when `given` names another optimizer than the family's); returns the keys it set.
std::vector<std::string> apply_family_defaults(TrainConfig& cfg, const std::set<std::string>& given);

}  // namespace ringtrain
