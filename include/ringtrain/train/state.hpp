#pragma once
// The training state that checkpoints save and rank 0 broadcasts: parameters
// (flat per dtype), buffers (BatchNorm running statistics) and optimizer state,
// under stable names in a fixed order, identical on every rank.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/core/tensor.hpp"
#include "ringtrain/train/checkpoint.hpp"
#include "ringtrain/train/config.hpp"

namespace ringtrain {

class Model;
class Optimizer;

using NamedTensorList = std::vector<std::pair<std::string, Tensor>>;

// Views (not copies): "param.<dtype>", "buffer.<name>", "optim.<name>".
NamedTensorList model_state(Model& model, Optimizer* optimizer);

// Scalars kept beside the tensors.
struct RunPosition {
  std::int64_t epochs_done = 0, step = 0, ranks = 1, seed = 0;
};

CheckpointData make_checkpoint(Model& model, Optimizer* optimizer, const TrainConfig& cfg, const RunPosition& pos);
// Restores tensors (all of model_state, or only params+buffers when optimizer is null).
RunPosition restore_checkpoint(const CheckpointData& ckpt, Model& model, Optimizer* optimizer);

}  // namespace ringtrain
