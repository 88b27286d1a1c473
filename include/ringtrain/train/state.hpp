#pragma once
// The training state that checkpoints save and rank 0 broadcasts: parameters,
// buffers (BatchNorm running statistics) and optimizer state, under stable
// names in a fixed order, identical on every rank.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/core/tensor.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/config.hpp"

namespace ringtrain {

using NamedTensorList = std::vector<std::pair<std::string, Tensor>>;

// The state's names (ModelState::named makes them, once for every layout),
// per parameter so the layout does not depend on how parameters lie in arenas:
// "param/<param name>", "buffer/<buffer name>", "optim/<slot>/<param name>"
// (each slot of the optimizer's per-parameter state, e.g.
// optim/exp_avg/conv1.weight), "optim/step", and "amp.loss_scale" (fp16).

// Where a run stands: enough to continue it bit for bit.
struct RunPosition {
  std::int64_t epochs_done = 0;    // completed epochs
  std::int64_t step = 0;           // optimizer steps taken in the whole run
  std::int64_t step_in_epoch = 0;  // optimizer steps taken in epoch `epochs_done` (mid-epoch stop)
  std::int64_t ranks = 1, seed = 0;
  std::int64_t batch_size = 0, accumulation = 1;  // what the loader's position depends on
  std::int64_t resumes = 0;        // how often this run was resumed
  std::int64_t params = 0;         // scalar parameters of the whole model
  // The layout that wrote it (informational: any layout loads any checkpoint;
  // data_parallel × batch_size is the global batch the data order depends on).
  std::int64_t pipeline = 1, tensor = 1, data_parallel = 1;
  std::string run_id;              // names the run's checkpoint files and metrics records
  // Of the run regardless of layout: the configuration without parallel.* and
  // the per-rank split, with the global batch (`--resume auto` matches it).
  std::string identity;
  std::int64_t steps_per_epoch = 0;  // optimizer steps per epoch
};

// A checkpoint of the whole named state `tensors` (model_state's names, with
// tensor-parallel shards whole) at `pos`: scalars, strings and the configuration (TOML text).
CheckpointData checkpoint_data(NamedTensorList tensors, std::string config_toml, const RunPosition& pos);
// Reads the position scalars and strings of a checkpoint (an Error names a missing one).
RunPosition checkpoint_position(const CheckpointData& ckpt);

}  // namespace ringtrain
