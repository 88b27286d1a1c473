#include "ringtrain/train/state.hpp"

#include "ringtrain/nn/model.hpp"
#include "ringtrain/optim/optimizer.hpp"

namespace ringtrain {

NamedTensorList model_state(Model& model, Optimizer* optimizer) {
  NamedTensorList out;
  for (DType dt : model.arena().dtypes()) out.emplace_back(cat("param.", dtype_name(dt)), model.arena().params_flat(dt));
  for (auto& b : model.buffers()) out.emplace_back("buffer." + b.name, b.tensor);
  if (optimizer)
    for (auto& [name, t] : optimizer->state()) out.emplace_back("optim." + name, t);
  return out;
}

CheckpointData make_checkpoint(Model& model, Optimizer* optimizer, const TrainConfig& cfg, const RunPosition& pos) {
  CheckpointData d;
  d.tensors = model_state(model, optimizer);
  d.scalars = {{"epochs_done", pos.epochs_done}, {"step", pos.step}, {"ranks", pos.ranks},
               {"seed", pos.seed}, {"params", model.num_params()}};
  d.config_toml = cfg.to_toml();
  return d;
}

RunPosition restore_checkpoint(const CheckpointData& ckpt, Model& model, Optimizer* optimizer) {
  for (auto& [name, t] : model_state(model, optimizer)) restore_tensor(ckpt, name, t);
  auto get = [&](const char* k) {
    auto it = ckpt.scalars.find(k);
    RT_CHECK(it != ckpt.scalars.end(), "checkpoint has no scalar '", k, "'");
    return it->second;
  };
  RunPosition p;
  p.epochs_done = get("epochs_done");
  p.step = get("step");
  p.ranks = get("ranks");
  p.seed = get("seed");
  return p;
}

}  // namespace ringtrain
