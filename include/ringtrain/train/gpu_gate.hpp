#pragma once
// The GPU validation gate: the one list of what has run on a GPU (features,
// layouts, models), with the date and card of the run whose tests passed. A
// job on CUDA that needs anything not on the list is refused by name, on every
// rank, before any rank waits (the check reads only the configuration); with
// train.device = auto such a job trains on the CPU instead. The one exception
// is 16-bit activation storage: a bf16/fp16 job on CUDA whose storage is not
// on the list (a cnn or resnet: "... storage of convolutions") keeps the
// verified float32 storage with 16-bit arithmetic (ModelConfig::storage16).
//
// A feature joins the list after its tests pass on a GPU (tests/gpu,
// tests/gpu/run_on_gpu_host.sh); docs/gpu.md prints the same list.
#include <string>
#include <vector>

#include "ringtrain/train/config.hpp"

namespace ringtrain {

struct GpuVerified {
  std::string feature;   // the name a refusal uses, e.g. "pipeline parallelism"
  std::string date;      // of the run whose tests passed, YYYY-MM-DD
  std::string card;      // the GPU it ran on
  std::string evidence;  // the tests and runs that passed there (docs/data/gpu/)
};

// The list, in the order docs/gpu.md shows it.
const std::vector<GpuVerified>& gpu_verified();
bool gpu_is_verified(const std::string& feature);

// What a CUDA run of `cfg` needs: the feature and the setting that asks for it.
struct GpuNeed {
  std::string feature;
  std::string setting;  // e.g. "parallel.pipeline = 2"
};
std::vector<GpuNeed> gpu_needs(const TrainConfig& cfg);
// `trial`: features a GPU test runs although they are not on the list yet
// (TrainerHooks::gpu_trial); they pass the gate like listed ones.
// The needs not on the list (empty: the gate lets the job run on CUDA).
std::vector<GpuNeed> gpu_unverified(const TrainConfig& cfg, const std::vector<std::string>& trial = {});
// "" when allowed, otherwise the refusal: every unverified feature with its setting.
std::string gpu_gate_refusal(const TrainConfig& cfg, const std::vector<std::string>& trial = {});
// Throws the refusal (an Error) for train.device = cuda.
void check_gpu_gate(const TrainConfig& cfg, const std::vector<std::string>& trial = {});

// 16-bit activation storage: the feature a bf16/fp16 job would use on CUDA
// ("" for fp32/tf32), and whether the gate allows it there. A model with a
// convolution, batch-norm or pooling layer (gpu_model_has_image_layers) needs
// "bf16/fp16 activation storage of convolutions"; others "... storage".
std::string gpu_storage16_feature(const TrainConfig& cfg);
// cnn, resnet, a [[model.layers]] list with a conv, batchnorm, maxpool or
// avgpool entry, or a registered model (not known: assumed to have one).
bool gpu_model_has_image_layers(const TrainConfig& cfg);
bool gpu_storage16_allowed(const TrainConfig& cfg, const std::vector<std::string>& trial = {});

}  // namespace ringtrain
