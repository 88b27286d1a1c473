#pragma once
// Per-element optimizer math, written once for the CPU loops (src/optim) and the
// CUDA fused kernels (cuda/): both call these RT_HD functions with coefficients
// built by the host-side make_*_coeffs() below, so the two backends agree to
// the bit wherever the compilers contract the same way.
//
// Rules kept here:
// - C is the compute type: float for f32/f16/bf16 parameters, double for f64.
//   Storage types convert through load()/store(); state buffers are always C.
// - Scalars are precomputed on the host in double, then cast to C once, in the
//   same order of operations as PyTorch 1.13 (torch.optim single-tensor path):
//   every product is written as PyTorch's CPU kernels evaluate it.
// - No branches on data, only on coefficients that are uniform over a tensor.
#include <math.h>

#include <cstdint>
#include <cstring>

#include "ringtrain/core/dtype.hpp"
#include "ringtrain/core/hd.hpp"

namespace ringtrain::optim_math {

// ---- storage <-> compute ---------------------------------------------------
template <typename T> struct compute_type { using type = T; };  // float, double
template <> struct compute_type<float16> { using type = float; };
template <> struct compute_type<bfloat16> { using type = float; };
template <typename T> using compute_t = typename compute_type<T>::type;

RT_HD float load(float x) { return x; }
RT_HD double load(double x) { return x; }
RT_HD float load(float16 x) { return to_f32(x); }
RT_HD float load(bfloat16 x) { return to_f32(x); }
RT_HD void store(float& d, float x) { d = x; }
RT_HD void store(double& d, double x) { d = x; }
RT_HD void store(float16& d, float x) { d = to_f16(x); }
RT_HD void store(bfloat16& d, float x) { d = to_bf16(x); }

RT_HD float hd_sqrt(float x) { return sqrtf(x); }
RT_HD double hd_sqrt(double x) { return sqrt(x); }

// Bit test, so it survives -ffast-math on either side.
RT_HD bool is_finite(float x) { return (f32_bits(x) & 0x7f800000u) != 0x7f800000u; }
RT_HD bool is_finite(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, 8);
  return (u & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}

// ---- SGD (torch.optim.SGD) -------------------------------------------------
//   d = g + wd·p                        (coupled L2)
//   buf = first ? d : momentum·buf + (1 − dampening)·d      (if momentum ≠ 0)
//   d = nesterov ? d + momentum·buf : buf                   (if momentum ≠ 0)
//   p = p − lr·d
template <typename C>
struct SgdCoeffs {
  C lr, wd, momentum, one_minus_dampening;
  bool nesterov, first;  // first: the buffer is initialised to d (PyTorch's clone)
};
template <typename C>
RT_HD void sgd_update(C& p, C g, C& buf, const SgdCoeffs<C>& k) {
  C d = k.wd != C(0) ? g + k.wd * p : g;
  if (k.momentum != C(0)) {
    buf = k.first ? d : buf * k.momentum + k.one_minus_dampening * d;
    d = k.nesterov ? d + k.momentum * buf : buf;
  }
  p = p + (-k.lr) * d;
}

// ---- Adam / AdamW (torch.optim.Adam, torch.optim.AdamW) --------------------
//   Adam:  g = g + wd·p                 AdamW: p = p·(1 − lr·wd)
//   m = β1·m + (1 − β1)·g
//   v = β2·v + (1 − β2)·g·g
//   p = p − (lr / (1 − β1^t))·m / (sqrt(v) / sqrt(1 − β2^t) + eps)   (eps outside the sqrt)
template <typename C>
struct AdamCoeffs {
  C beta1, one_minus_beta1, beta2, one_minus_beta2;
  C neg_step_size;  // −lr / (1 − β1^t)
  C bc2_sqrt;       // sqrt(1 − β2^t)
  C eps;
  C wd;             // Adam: coupled L2 on the gradient; 0 for AdamW
  C decay_factor;   // AdamW: 1 − lr·wd applied to p first; 1 for Adam
};
template <typename C>
RT_HD void adam_update(C& p, C g, C& m, C& v, const AdamCoeffs<C>& k) {
  if (k.wd != C(0)) g = g + k.wd * p;
  if (k.decay_factor != C(1)) p = p * k.decay_factor;
  m = m * k.beta1 + k.one_minus_beta1 * g;
  v = v * k.beta2 + k.one_minus_beta2 * g * g;
  C denom = hd_sqrt(v) / k.bc2_sqrt + k.eps;
  p = p + k.neg_step_size * m / denom;
}

// ---- LARS (You, Gitman, Ginsburg 2017, Algorithm 1) ------------------------
// Per parameter tensor, with decay:   λ = η·||w|| / (||g|| + wd·||w||)
//   (λ = 1 when ||w|| or ||g|| is 0), local_lr = lr·λ; without decay: local_lr = lr, wd = 0.
//   v = momentum·v + local_lr·(g + wd·w)
//   w = w − v
template <typename C>
struct LarsCoeffs {
  C local_lr, wd, momentum;
};
template <typename C>
RT_HD void lars_update(C& p, C g, C& v, const LarsCoeffs<C>& k) {
  C d = g + k.wd * p;
  v = k.momentum * v + k.local_lr * d;
  p = p - v;
}

// ---- LAMB (You et al. 2019, Algorithm 2, with bias correction) -------------
// Two passes per parameter tensor:
//   1. m = β1·m + (1 − β1)·g;  v = β2·v + (1 − β2)·g·g
//      u = (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + eps) + wd·w;  accumulate ||u||², ||w||²
//   2. r = ||w|| / ||u|| (1 when either is 0; clipped to max_trust_ratio if > 0);
//      without decay r = 1 and wd = 0;  w = w − lr·r·u (u recomputed from the new m, v).
template <typename C>
struct LambCoeffs {
  C beta1, one_minus_beta1, beta2, one_minus_beta2;
  C inv_bc1, inv_bc2;  // 1 / (1 − β^t), or 1 without bias correction
  C eps, wd;
};
template <typename C>
RT_HD void lamb_moments(C g, C& m, C& v, const LambCoeffs<C>& k) {
  m = m * k.beta1 + k.one_minus_beta1 * g;
  v = v * k.beta2 + k.one_minus_beta2 * g * g;
}
template <typename C>
RT_HD C lamb_direction(C p, C m, C v, const LambCoeffs<C>& k) {
  return (m * k.inv_bc1) / (hd_sqrt(v * k.inv_bc2) + k.eps) + k.wd * p;
}
template <typename C>
RT_HD void lamb_apply(C& p, C u, C scaled_lr /* lr·r */) {
  p = p - scaled_lr * u;
}

// ---- gradient scaling (dynamic loss scaling, clipping) ---------------------
template <typename C>
RT_HD C scale_grad(C g, C factor) {
  return g * factor;
}

// ---- host-side coefficient builders (double → C once) ----------------------
// t is the 1-based number of the step being taken.
template <typename C>
inline SgdCoeffs<C> make_sgd_coeffs(double lr, double wd, double momentum, double dampening,
                                    bool nesterov, std::int64_t t) {
  return {C(lr), C(wd), C(momentum), C(1.0 - dampening), nesterov, t == 1};
}
template <typename C>
inline AdamCoeffs<C> make_adam_coeffs(double lr, double beta1, double beta2, double eps, double wd,
                                      bool decoupled, std::int64_t t) {
  double bc1 = 1.0 - pow(beta1, static_cast<double>(t));
  double bc2 = 1.0 - pow(beta2, static_cast<double>(t));
  return {C(beta1), C(1.0 - beta1), C(beta2), C(1.0 - beta2), C(-(lr / bc1)), C(sqrt(bc2)),
          C(eps), decoupled ? C(0) : C(wd), decoupled ? C(1.0 - lr * wd) : C(1)};
}
template <typename C>
inline LambCoeffs<C> make_lamb_coeffs(double beta1, double beta2, double eps, double wd,
                                      bool bias_correction, std::int64_t t) {
  double bc1 = bias_correction ? 1.0 - pow(beta1, static_cast<double>(t)) : 1.0;
  double bc2 = bias_correction ? 1.0 - pow(beta2, static_cast<double>(t)) : 1.0;
  return {C(beta1), C(1.0 - beta1), C(beta2), C(1.0 - beta2), C(1.0 / bc1), C(1.0 / bc2),
          C(eps), C(wd)};
}
// LARS local learning-rate factor λ from the tensor norms (see above).
inline double lars_trust_ratio(double w_norm, double g_norm, double eta, double wd) {
  if (w_norm > 0.0 && g_norm > 0.0) return eta * w_norm / (g_norm + wd * w_norm);
  return 1.0;
}
// LAMB trust ratio r from ||w|| and ||u|| (see above); max_ratio <= 0: no clip.
inline double lamb_trust_ratio(double w_norm, double u_norm, double max_ratio) {
  double r = (w_norm > 0.0 && u_norm > 0.0) ? w_norm / u_norm : 1.0;
  return (max_ratio > 0.0 && r > max_ratio) ? max_ratio : r;
}

}  // namespace ringtrain::optim_math
