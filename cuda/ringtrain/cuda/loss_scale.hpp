#pragma once
// Dynamic loss scaling for fp16/bf16 training, kept entirely on the device so
// a step never waits for the host:
//   loss gradient seeded with `scale` (softmax_xent's grad_scale = scale_ptr())
//   -> backward -> unscale_and_check() on each gradient buffer (g *= 1/scale,
//   found_inf |= any non-finite) -> optimizer kernels read found_inf_ptr() and
//   leave weights and state untouched when it is set -> update(): on overflow
//   the scale is multiplied by `backoff` (the step counts as skipped), after
//   `interval` good steps in a row by `growth`; found_inf is cleared.
// loss_scale_step() is the rule itself, RT_HD so the host tests replay it.
#include <cuda_runtime.h>

#include <cstddef>

#include "ringtrain/core/dtype.hpp"
#include "ringtrain/core/hd.hpp"

namespace ringtrain::cuda {

struct LossScaleConfig {
  float init_scale = 65536.0f;
  float growth = 2.0f;
  float backoff = 0.5f;
  int interval = 2000;  // good steps before the scale grows
  float min_scale = 1.0f;
  float max_scale = 16777216.0f;  // 2^24
};

struct LossScaleState {
  float scale = 1.0f;
  float inv_scale = 1.0f;
  int good_steps = 0;
  int found_inf = 0;
  long long steps = 0;
  long long skipped = 0;
};

RT_HD void loss_scale_step(LossScaleState& s, const LossScaleConfig& c) {
  if (s.found_inf) {
    float v = s.scale * c.backoff;
    s.scale = v < c.min_scale ? c.min_scale : v;
    s.good_steps = 0;
    ++s.skipped;
  } else if (++s.good_steps >= c.interval) {
    float v = s.scale * c.growth;
    s.scale = v > c.max_scale ? c.max_scale : v;
    s.good_steps = 0;
  }
  s.inv_scale = 1.0f / s.scale;
  s.found_inf = 0;
  ++s.steps;
}

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(const LossScaleConfig& cfg = {}, int device = 0);
  ~DynamicLossScaler();
  DynamicLossScaler(const DynamicLossScaler&) = delete;
  DynamicLossScaler& operator=(const DynamicLossScaler&) = delete;

  const LossScaleConfig& config() const { return cfg_; }
  const float* scale_ptr() const { return &state_->scale; }  // device
  const int* found_inf_ptr() const { return &state_->found_inf; }  // device; optimizers skip when set

  // g *= 1/scale over `n` elements of dtype `dt`; flags inf/NaN. Once per gradient buffer.
  void unscale_and_check(void* grads, std::size_t n, DType dt, cudaStream_t stream);
  // Applies loss_scale_step() on the device (after the optimizer kernels).
  void update(cudaStream_t stream);
  // Host snapshot (waits for `stream`): for logging, checkpoints and tests.
  LossScaleState read(cudaStream_t stream) const;
  // Overwrites the device state (resume from a checkpoint).
  void write(const LossScaleState& s, cudaStream_t stream);

 private:
  LossScaleConfig cfg_;
  int device_;
  LossScaleState* state_ = nullptr;  // device memory
};

}  // namespace ringtrain::cuda
