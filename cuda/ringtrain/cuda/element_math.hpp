#pragma once
// Element-wise math of the CUDA kernels that has no library equivalent. The
// shared host/device math lives with its owners and is used, not copied:
// reductions and dtype loads/stores (comm/reduce_math.hpp: to_acc/from_acc,
// combine, reduce_one_div — the same rounding as the CPU reducer, so device and
// host collectives agree bitwise), dropout's counter RNG (nn/rng.hpp) and the
// optimizer updates (optim/update_math.hpp). Only GELU is defined here.
#include <math.h>

#include "ringtrain/comm/reduce_math.hpp"
#include "ringtrain/core/hd.hpp"
#include "ringtrain/nn/rng.hpp"

namespace ringtrain::cuda {

using ringtrain::acc_t;
using ringtrain::from_acc;
using ringtrain::to_acc;

// GELU, exact (erf) form, as PyTorch's default nn.GELU.
RT_HD float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
RT_HD float gelu_grad(float x) {
  float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
  float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
  return cdf + x * pdf;
}
// GELU, tanh approximation (GPT-2, PyTorch's approximate="tanh"): 0.5 x (1 + tanh(u)),
// u = sqrt(2/pi) (x + 0.044715 x^3).
RT_HD float gelu_tanh(float x) {
  const float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
RT_HD float gelu_tanh_grad(float x) {
  const float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  const float t = tanhf(u);
  const float du = 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

}  // namespace ringtrain::cuda
