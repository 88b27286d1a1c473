// The registry of user models: one per process, made on first use (a static
// initialiser in a static library could be dropped by the linker).
#include "ringtrain/nn/model_registry.hpp"

#include <algorithm>
#include <map>
#include <mutex>

#include "ringtrain/core/error.hpp"

namespace ringtrain {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, ModelBuilder> builders;
  std::map<std::string, LossBuilder> losses;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

const std::vector<std::string>& builtin_model_names() {
  // The names build_layers (models.cpp) dispatches itself; anything else goes to the registry.
  static const std::vector<std::string> names = {"mlp", "cnn", "resnet", "vit", "gpt", "layers"};
  return names;
}

void register_model(const std::string& name, ModelBuilder builder, LossBuilder loss) {
  RT_CHECK(!name.empty(), "register_model: the model name is empty");
  RT_CHECK(builder != nullptr, "register_model('", name, "'): the builder is empty");
  RT_CHECK(!is_builtin_model(name), "register_model('", name, "'): '", name, "' is a built-in model (built-in: ",
           join(builtin_model_names()), "); choose another name");
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  RT_CHECK(!r.builders.count(name), "register_model('", name, "'): a model of that name is already registered");
  r.builders.emplace(name, std::move(builder));
  if (loss) r.losses.emplace(name, std::move(loss));
}

bool is_registered_model(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  return r.builders.count(name) > 0;
}

std::vector<std::string> registered_model_names() {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  std::vector<std::string> out;
  for (const auto& [name, b] : r.builders) out.push_back(name);
  return out;
}

bool is_builtin_model(const std::string& name) {
  const auto& builtin = builtin_model_names();
  return std::find(builtin.begin(), builtin.end(), name) != builtin.end();
}

bool is_known_model(const std::string& name) { return is_builtin_model(name) || is_registered_model(name); }

std::string known_model_list() {
  std::vector<std::string> all = builtin_model_names();
  for (auto& n : registered_model_names()) all.push_back(n);
  return join(all);
}

std::vector<LayerPtr> build_registered_model(const ModelConfig& cfg) {
  ModelBuilder b;
  {
    Registry& r = registry();
    std::lock_guard lk(r.mu);
    auto it = r.builders.find(cfg.name);
    if (it != r.builders.end()) b = it->second;
  }
  RT_CHECK(b != nullptr, "unknown model '", cfg.name, "' (known: ", known_model_list(), ")");
  std::vector<LayerPtr> layers;
  try {
    layers = b(cfg);
  } catch (const std::exception& e) {  // named after the model unless the message already is
    const std::string what = e.what();
    if (what.find("'" + cfg.name + "'") != std::string::npos) throw;
    RT_FAIL("model '", cfg.name, "': ", what);
  }
  RT_CHECK(!layers.empty(), "model '", cfg.name, "': the registered builder returned no layers");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    RT_CHECK(layers[i] != nullptr, "model '", cfg.name, "': the registered builder returned a null layer at index ", i);
    for (std::size_t j = 0; j < i; ++j)
      RT_CHECK(layers[j]->name() != layers[i]->name(), "model '", cfg.name, "': top-level layers ", j, " and ", i,
               " are both named '", layers[i]->name(), "' (names must be unique: parameters are named after them)");
  }
  return layers;
}

LossPtr model_loss(const ModelConfig& cfg, const Layer* last) {
  LossBuilder b;
  {
    Registry& r = registry();
    std::lock_guard lk(r.mu);
    auto it = r.losses.find(cfg.name);
    if (it != r.losses.end()) b = it->second;
  }
  if (b) {
    LossPtr loss;
    try {
      loss = b(cfg);
    } catch (const std::exception& e) {
      RT_FAIL("model '", cfg.name, "': its loss: ", e.what());
    }
    RT_CHECK(loss != nullptr, "model '", cfg.name, "': the registered loss builder returned no loss");
    return loss;
  }
  if (last)
    if (LossPtr own = last->output_loss()) return own;
  return cross_entropy_loss();
}

}  // namespace ringtrain
