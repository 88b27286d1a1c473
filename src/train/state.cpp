#include "ringtrain/train/state.hpp"

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

CheckpointData make_checkpoint(Model& model, Optimizer* optimizer, const TrainConfig& cfg, const RunPosition& pos) {
  CheckpointData d;
  d.tensors = model_state(model, optimizer);
  d.scalars = {{"epochs_done", pos.epochs_done}, {"step", pos.step},   {"step_in_epoch", pos.step_in_epoch},
               {"ranks", pos.ranks},             {"seed", pos.seed},   {"params", model.num_params()},
               {"batch_size", pos.batch_size},   {"accumulation", pos.accumulation},
               {"resumes", pos.resumes}};
  d.strings = {{"run_id", pos.run_id}, {"fingerprint", pos.fingerprint}};
  d.config_toml = cfg.to_toml();
  return d;
}

RunPosition checkpoint_position(const CheckpointData& ckpt) {
  auto get = [&](const char* k) {
    auto it = ckpt.scalars.find(k);
    RT_CHECK(it != ckpt.scalars.end(), "checkpoint has no scalar '", k, "'");
    return it->second;
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
  p.run_id = text("run_id");
  p.fingerprint = text("fingerprint");
  return p;
}

RunPosition restore_checkpoint(const CheckpointData& ckpt, Model& model, Optimizer* optimizer) {
  // Check every name first, so a mismatch leaves the model untouched.
  NamedTensorList want = model_state(model, optimizer);
  for (auto& [name, t] : want) {
    bool found = false;
    for (auto& [n, c] : ckpt.tensors)
      if (n == name) {
        found = true;
        RT_CHECK(c.dtype() == t.dtype() && c.shape() == t.shape(), "checkpoint tensor '", name, "' is ",
                 dtype_name(c.dtype()), " ", shape_str(c.shape()), ", but this model has ", dtype_name(t.dtype()),
                 " ", shape_str(t.shape()), " (was it written for another model?)");
        break;
      }
    RT_CHECK(found, "checkpoint has no tensor '", name, "' (was it written for another model or optimizer?)");
  }
  for (auto& [name, t] : want) restore_tensor(ckpt, name, t);
  return checkpoint_position(ckpt);
}

}  // namespace ringtrain
