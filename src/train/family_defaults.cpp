#include "ringtrain/train/family_defaults.hpp"

#include <toml++/toml.h>

#include <algorithm>

#include "ringtrain/core/error.hpp"

namespace ringtrain {

namespace {
std::string num(double v) { return cat(v); }
}  // namespace

std::vector<std::pair<std::string, std::string>> family_defaults(const std::string& model, std::int64_t width) {
  const double w = double(std::max<std::int64_t>(width, 1));
  // gpt: GPT-2/GPT-3's recipe as nanoGPT and llm.c train it: AdamW, betas 0.9/0.95, decoupled
  // decay 0.1 on the matrices (biases, norms and positions register decay = false), clipping at 1,
  // warm-up, cosine to a tenth. The lr is 6e-4 at GPT-2 small's width 768 and goes as 1/width
  // (GPT-3's table 2.1 falls about so: 3e-4 at 1024 .. 1.2e-4 at 4096), capped at 1e-2 for
  // the narrow models of a laptop. Adam moves every weight by about lr per step whatever its
  // gradient, so the cnn's lr = 0.05 under adamw rewrites GPT-2's 0.02-scale weights in one
  // step (the 124M shape's loss 11 -> 40 at step 3).
  if (model == "gpt") {
    const double lr = std::min(6e-4 * 768 / w, 1e-2);
    return {{"optimizer.name", "adamw"},      {"optimizer.lr", num(lr)},        {"optimizer.beta1", "0.9"},
            {"optimizer.beta2", "0.95"},      {"optimizer.weight_decay", "0.1"}, {"optimizer.clip_norm", "1.0"},
            {"schedule.name", "cosine"},      {"schedule.warmup_epochs", "0.1"}, {"schedule.min_lr", num(lr / 10)}};
  }
  // vit: DeiT's recipe (Touvron et al. 2021): AdamW, decay 0.05, betas 0.9/0.999, clipping, warm-up
  // then cosine; lr 1e-3 at DeiT-S's width 384, as 1/width like gpt, capped at 1e-2.
  if (model == "vit") {
    const double lr = std::min(1e-3 * 384 / w, 1e-2);
    return {{"optimizer.name", "adamw"},      {"optimizer.lr", num(lr)},         {"optimizer.beta1", "0.9"},
            {"optimizer.beta2", "0.999"},     {"optimizer.weight_decay", "0.05"}, {"optimizer.clip_norm", "1.0"},
            {"schedule.name", "cosine"},      {"schedule.warmup_epochs", "0.5"},  {"schedule.min_lr", num(lr / 100)}};
  }
  return {};
}

std::set<std::string> given_keys(const std::string& toml_path, const std::vector<std::string>& sets) {
  std::set<std::string> out;
  if (!toml_path.empty()) {  // already parsed by TrainConfig::load_toml, so errors were reported there
    const toml::table tbl = toml::parse_file(toml_path);
    for (const auto& [section, node] : tbl)
      if (const toml::table* sub = node.as_table())
        for (const auto& [key, value] : *sub) out.insert(std::string(section.str()) + "." + std::string(key.str()));
  }
  for (const auto& s : sets) out.insert(s.substr(0, s.find('=')));
  return out;
}

std::vector<std::string> apply_family_defaults(TrainConfig& cfg, const std::set<std::string>& given) {
  std::vector<std::string> applied;
  const auto recipe = family_defaults(cfg.model.name, cfg.model.width);
  // Another optimizer chosen by name: the recipe (tuned for AdamW) is not the user's; none of it applies.
  if (recipe.empty() || (given.count("optimizer.name") && cfg.optimizer.name != recipe.front().second)) return applied;
  for (const auto& [key, value] : recipe) {
    if (given.count(key)) continue;
    cfg.set(key + "=" + value);
    applied.push_back(key);
  }
  return applied;
}

}  // namespace ringtrain
