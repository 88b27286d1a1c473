#pragma once
// The GPU mixed-precision trainer tests (mpi_bf16_vit.cpp, mpi_fp16_vit.cpp):
// the CPU's small vit (train/fixtures.hpp mixed_precision_vit) on the GPU.
#include <string>

#include "train/fixtures.hpp"

namespace rt_gpu {

inline ringtrain::TrainConfig vit_config(const std::string& data, const std::string& precision, int steps) {
  ringtrain::TrainConfig c = ringtrain::test_fixtures::mixed_precision_vit(data, precision, steps);
  c.train.device = "cuda";
  return c;
}

}  // namespace rt_gpu
