#include "ringtrain/train/state.hpp"

#include <algorithm>

#include "ringtrain/nn/model.hpp"
#include "ringtrain/optim/optimizer.hpp"

namespace ringtrain {

NamedTensorList model_state(Model& model, Optimizer* optimizer) {
  NamedTensorList out;
  const ParamArena& a = model.arena();
  for (std::size_t i = 0; i < a.size(); ++i) out.emplace_back("param/" + a.info(i).name, a.param(i));
  for (auto& b : model.buffers()) out.emplace_back("buffer/" + b.name, b.tensor);
  if (!optimizer) return out;
  // Optimizer state: "<param dtype>.<slot>" buffers laid out like the arena are
  // cut per parameter; anything else (the step counter) is kept whole.
  for (auto& [name, t] : optimizer->state()) {
    auto dot = name.find('.');
    bool per_param = false;
    if (dot != std::string::npos) {
      const std::string dt = name.substr(0, dot), slot = name.substr(dot + 1);
      for (std::size_t i = 0; i < a.size(); ++i) {
        const ParamInfo& p = a.info(i);
        if (dtype_name(p.dtype) != dt) continue;
        per_param = true;
        out.emplace_back("optim/" + slot + "/" + p.name,
                         t.flat_view(static_cast<std::int64_t>(p.offset), shape_numel(p.shape)).reshape(p.shape));
      }
    }
    if (!per_param) out.emplace_back("optim/" + name, t);
  }
  return out;
}

NamedTensorList flat_state(Model& model, Optimizer* optimizer) {
  NamedTensorList out;
  for (DType dt : model.arena().dtypes()) out.emplace_back(cat("param.", dtype_name(dt)), model.arena().params_flat(dt));
  for (auto& b : model.buffers()) out.emplace_back("buffer." + b.name, b.tensor);
  if (optimizer)
    for (auto& [name, t] : optimizer->state()) out.emplace_back("optim." + name, t);
  return out;
}

CheckpointData checkpoint_data(NamedTensorList tensors, const TrainConfig& cfg, const RunPosition& pos) {
  CheckpointData d;
  d.tensors = std::move(tensors);
  d.scalars = {{"epochs_done", pos.epochs_done}, {"step", pos.step},     {"step_in_epoch", pos.step_in_epoch},
               {"ranks", pos.ranks},             {"seed", pos.seed},     {"params", pos.params},
               {"batch_size", pos.batch_size},   {"accumulation", pos.accumulation},
               {"resumes", pos.resumes},         {"pipeline", pos.pipeline}, {"tensor", pos.tensor},
               {"data_parallel", pos.data_parallel}, {"steps_per_epoch", pos.steps_per_epoch}};
  d.strings = {{"run_id", pos.run_id}, {"fingerprint", pos.fingerprint}, {"run_identity", pos.identity}};
  d.config_toml = cfg.to_toml();
  return d;
}

RunPosition checkpoint_position(const CheckpointData& ckpt) {
  auto get = [&](const char* k) {
    auto it = ckpt.scalars.find(k);
    RT_CHECK(it != ckpt.scalars.end(), "checkpoint has no scalar '", k, "'");
    return it->second;
  };
  auto get_or = [&](const char* k, std::int64_t dflt) {
    auto it = ckpt.scalars.find(k);
    return it == ckpt.scalars.end() ? dflt : it->second;
  };
  auto text = [&](const char* k) {
    auto it = ckpt.strings.find(k);
    return it == ckpt.strings.end() ? std::string() : it->second;
  };
  RunPosition p;
  p.epochs_done = get("epochs_done");
  p.step = get("step");
  p.step_in_epoch = get("step_in_epoch");
  p.ranks = get("ranks");
  p.seed = get("seed");
  p.batch_size = get("batch_size");
  p.accumulation = get("accumulation");
  p.resumes = get("resumes");
  p.params = get_or("params", 0);
  p.pipeline = get_or("pipeline", 1);
  p.tensor = get_or("tensor", 1);
  p.data_parallel = get_or("data_parallel", p.ranks / std::max<std::int64_t>(1, p.pipeline * p.tensor));
  p.run_id = text("run_id");
  p.fingerprint = text("fingerprint");
  p.identity = text("run_identity");
  p.steps_per_epoch = get_or("steps_per_epoch", 0);
  return p;
}

}  // namespace ringtrain
