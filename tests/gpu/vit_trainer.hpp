#pragma once
// The GPU mixed-precision trainer tests (mpi_bf16_vit.cpp, mpi_fp16_vit.cpp):
// the CPU's small vit (train/fixtures.hpp mixed_precision_vit) on the GPU.
// 16-bit activation storage is not on the GPU validation gate's list yet
// (train/gpu_gate.hpp): the trainer would keep float32 storage, so these tests
// run it as a trial (TrainerHooks::gpu_trial) to verify it.
#include <string>
#include <vector>

#include "train/fixtures.hpp"

namespace rt_gpu {

inline ringtrain::TrainConfig vit_config(const std::string& data, const std::string& precision, int steps) {
  ringtrain::TrainConfig c = ringtrain::test_fixtures::mixed_precision_vit(data, precision, steps);
  c.train.device = "cuda";
  return c;
}

// Per-step losses of `c` with `trial` features let through the gate.
inline std::vector<double> trial_losses(const ringtrain::TrainConfig& c, const ringtrain::Communicator& comm,
                                        std::vector<std::string> trial, ringtrain::TrainResult* out = nullptr) {
  ringtrain::TrainerHooks hooks;
  hooks.report = false;
  hooks.gpu_trial = std::move(trial);
  std::vector<double> losses;
  hooks.on_step = [&](std::int64_t, double l) { losses.push_back(l); };
  ringtrain::Trainer t(c, comm, hooks);
  ringtrain::TrainResult r = t.fit();
  if (out) *out = r;
  return losses;
}

}  // namespace rt_gpu
