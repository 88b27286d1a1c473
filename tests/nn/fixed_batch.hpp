#pragma once
// The fixed-batch `cnn` run shared by test_nn_cnn_fixed_batch (CPU, in CI) and
// test_gpu_train_cnn (GPU vs CPU): the CPU test keeps the set-up itself honest
// (it must learn), so a GPU failure points at the GPU. The GPU run found the
// first version diverging on both devices (lr 0.1: loss 3.02 -> 3.29).
#include <cstdint>
#include <random>

#include "ringtrain/core/tensor.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/optim/optimizer.hpp"

namespace rt_fixed_batch {

inline constexpr int kBatch = 64;
inline constexpr int kSteps = 12;
inline constexpr double kLr = 0.005;  // 0.01 and above overshoot on the first step (loss 3.1 -> 3.5..20)

inline ringtrain::ModelConfig model_config() {
  ringtrain::ModelConfig mc;
  mc.name = "cnn";
  return mc;
}

inline ringtrain::OptimizerConfig optimizer_config() {
  ringtrain::OptimizerConfig oc;
  oc.name = "sgd";
  oc.momentum = 0.9;
  return oc;
}

// Uniform(-1, 1) images and labels (7 i) mod 10: a batch to memorise.
inline ringtrain::Tensor images(std::uint32_t seed = 21) {
  using namespace ringtrain;
  Tensor x = Tensor::empty({kBatch, 1, 28, 28}, DType::f32);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = d(gen);
  return x;
}

inline ringtrain::Tensor labels() {
  using namespace ringtrain;
  Tensor y = Tensor::empty({kBatch}, DType::i32);
  for (int i = 0; i < kBatch; ++i) y.data<std::int32_t>()[i] = (i * 7) % 10;
  return y;
}

}  // namespace rt_fixed_batch
