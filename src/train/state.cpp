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
  d.strings = {{"run_id", pos.run_id}, {"fingerprint", pos.fingerprint}, {"run_identity", pos.identity}};
  d.config_toml = std::move(config_toml);
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
