#pragma once
// The small vit training set-up shared by the GPU mixed-precision trainer
// tests (mpi_bf16_vit.cpp, mpi_fp16_vit.cpp): 16 tokens of 28x28 images,
// AdamW at a constant rate, `steps` steps on the GPU.
#include <string>

#include "ringtrain/train/trainer.hpp"
#include "train/fixtures.hpp"

namespace rt_gpu {

inline ringtrain::TrainConfig vit_config(const std::string& data, const std::string& precision, int steps) {
  ringtrain::TrainConfig c = ringtrain::test_fixtures::small_config(data);
  c.model.name = "vit";
  c.model.width = 32;
  c.model.heads = 2;
  c.model.depth = 2;
  c.model.mlp_ratio = 2;
  c.model.patch = 7;  // 16 tokens of 28x28 images
  c.data.batch_size = 32;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 1e-3;
  c.optimizer.momentum = 0;
  c.schedule.name = "constant";
  c.train.epochs = 4;  // more than enough steps at 4 ranks; max_steps stops
  c.train.max_steps = steps;
  c.train.device = "cuda";
  c.train.precision = precision;
  return c;
}

}  // namespace rt_gpu
