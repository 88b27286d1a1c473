#include "ringtrain/train/state.hpp"

#include <algorithm>

namespace ringtrain {

CheckpointData checkpoint_data(NamedTensorList tensors, std::string config_toml, const RunPosition& pos) {
  CheckpointData d;
  d.tensors = std::move(tensors);
  d.scalars = {{"epochs_done", pos.epochs_done}, {"step", pos.step},     {"step_in_epoch", pos.step_in_epoch},
               {"ranks", pos.ranks},             {"seed", pos.seed},     {"params", pos.params},
               {"batch_size", pos.batch_size},   {"accumulation", pos.accumulation},
               {"resumes", pos.resumes},         {"pipeline", pos.pipeline}, {"tensor", pos.tensor},
               {"data_parallel", pos.data_parallel}, {"steps_per_epoch", pos.steps_per_epoch}};
  d.strings = {{"run_id", pos.run_id}, {"run_identity", pos.identity}};
  d.config_toml = std::move(config_toml);
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
  p.params = get("params");
  p.pipeline = get("pipeline");
  p.tensor = get("tensor");
  p.data_parallel = get("data_parallel");
  p.run_id = text("run_id");
  p.identity = text("run_identity");
  p.steps_per_epoch = get("steps_per_epoch");
  return p;
}

}  // namespace ringtrain
