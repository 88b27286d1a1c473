// LARS and LAMB on the CPU: per-tensor norms (deterministic chunked sums in
// double, combined over a sharded parameter's pieces by Optimizer::combine_sums),
// then the element update from update_math.hpp.
#include "cpu_loops.hpp"
#include "ringtrain/optim/optimizer.hpp"

namespace ringtrain {

using namespace optim_math;
using optim_detail::chunked_reduce;
using optim_detail::dispatch_floating;
using optim_detail::parallel_chunks;

namespace {
struct Sums {
  double w = 0.0, u = 0.0;
  Sums& operator+=(const Sums& o) {
    w += o.w;
    u += o.u;
    return *this;
  }
};

// Element loops over [b, e): restrict pointers and by-value coefficients let GCC vectorise.
template <typename T, typename C>
void lars_kernel(T* __restrict p, const T* __restrict g, C* __restrict v, std::int64_t b, std::int64_t e,
                 LarsCoeffs<C> k) {
  for (std::int64_t j = b; j < e; ++j) {
    C pj = load(p[j]);
    lars_update(pj, load(g[j]), v[j], k);
    store(p[j], pj);
  }
}
// LAMB pass 1: moments, and the sums of w² and u² for the trust ratio.
template <typename T, typename C>
Sums lamb_pass1(const T* __restrict p, const T* __restrict g, C* __restrict m, C* __restrict v, std::int64_t b,
                std::int64_t e, LambCoeffs<C> k) {
  double sw = 0.0, su = 0.0;
#pragma omp simd reduction(+ : sw, su)
  for (std::int64_t j = b; j < e; ++j) {
    C pj = load(p[j]);
    lamb_moments(load(g[j]), m[j], v[j], k);
    double u = static_cast<double>(lamb_direction(pj, m[j], v[j], k));
    sw += static_cast<double>(pj) * static_cast<double>(pj);
    su += u * u;
  }
  return Sums{sw, su};
}
// LAMB pass 2: w −= lr·r·u with u recomputed from the updated moments.
template <typename T, typename C>
void lamb_pass2(T* __restrict p, const C* __restrict m, const C* __restrict v, std::int64_t b, std::int64_t e,
                LambCoeffs<C> k, C scaled_lr) {
  for (std::int64_t j = b; j < e; ++j) {
    C pj = load(p[j]);
    lamb_apply(pj, lamb_direction(pj, m[j], v[j], k), scaled_lr);
    store(p[j], pj);
  }
}
// Without decay (r = 1): moments and update in one pass.
template <typename T, typename C>
void lamb_single_pass(T* __restrict p, const T* __restrict g, C* __restrict m, C* __restrict v, std::int64_t b,
                      std::int64_t e, LambCoeffs<C> k, C scaled_lr) {
  for (std::int64_t j = b; j < e; ++j) {
    C pj = load(p[j]);
    lamb_moments(load(g[j]), m[j], v[j], k);
    lamb_apply(pj, lamb_direction(pj, m[j], v[j], k), scaled_lr);
    store(p[j], pj);
  }
}
}  // namespace

Lars::Lars(ParamArena& arena, OptimizerConfig cfg) : Optimizer(arena, std::move(cfg), "lars") {
  require_cpu();
  add_state("momentum_buffer");
}

// Two passes over the parameters: the sums of squares of w and g first (so a
// sharded run can combine the pieces of a parameter, combine_sums), then the update.
void Lars::update(double lr, std::int64_t) {
  const OptimizerConfig& c = config();
  const std::size_t np = arena().size();
  std::vector<double> sums(2 * np, 0.0);  // ||w||², ||g||² of parameters that decay
  for (std::size_t i = 0; i < np; ++i) {
    const ParamInfo& info = arena().info(i);
    if (!decays(i)) continue;
    dispatch_floating(info.dtype, "lars", [&](auto tag) {
      using T = decltype(tag);
      const std::int64_t n = shape_numel(info.shape);
      const T* p = arena().params_flat(info.dtype).template data<T>() + info.offset;
      const T* g = arena().grads_flat(info.dtype).template data<T>() + info.offset;
      auto sq = [&](const T* x) {
        return chunked_reduce<double>(n, [&](std::int64_t b, std::int64_t e) { return optim_detail::sum_squares(x, b, e); });
      };
      sums[2 * i] = sq(p);
      sums[2 * i + 1] = sq(g);
    });
  }
  combine_sums(sums, 2);
  for (std::size_t i = 0; i < np; ++i) {
    const ParamInfo& info = arena().info(i);
    dispatch_floating(info.dtype, "lars", [&](auto tag) {
      using T = decltype(tag);
      using C = compute_t<T>;
      const std::int64_t n = shape_numel(info.shape);
      T* p = arena().params_flat(info.dtype).template data<T>() + info.offset;
      const T* g = arena().grads_flat(info.dtype).template data<T>() + info.offset;
      C* v = state_flat("momentum_buffer", info.dtype).template data<C>() + info.offset;
      double local_lr = lr, wd = 0.0;
      if (decays(i)) {
        wd = c.weight_decay;
        local_lr = lr * lars_trust_ratio(std::sqrt(sums[2 * i]), std::sqrt(sums[2 * i + 1]), c.trust_coefficient, wd);
      }
      const LarsCoeffs<C> k{C(local_lr), C(wd), C(c.momentum)};
      parallel_chunks(n, [&](std::int64_t b, std::int64_t e) { lars_kernel(p, g, v, b, e, k); });
    });
  }
}

Lamb::Lamb(ParamArena& arena, OptimizerConfig cfg) : Optimizer(arena, std::move(cfg), "lamb") {
  require_cpu();
  add_state("exp_avg");
  add_state("exp_avg_sq");
}

// Pass 1 (parameters that decay): moments, and the sums of squares of w and of
// the update direction u; the sums are combined (combine_sums) before pass 2
// takes the trust ratios and applies the update.
void Lamb::update(double lr, std::int64_t t) {
  const OptimizerConfig& c = config();
  const std::size_t np = arena().size();
  std::vector<double> sums(2 * np, 0.0);
  for (std::size_t i = 0; i < np; ++i) {
    const ParamInfo& info = arena().info(i);
    if (!decays(i)) continue;
    dispatch_floating(info.dtype, "lamb", [&](auto tag) {
      using T = decltype(tag);
      using C = compute_t<T>;
      const std::int64_t n = shape_numel(info.shape);
      const T* p = arena().params_flat(info.dtype).template data<T>() + info.offset;
      const T* g = arena().grads_flat(info.dtype).template data<T>() + info.offset;
      C* m = state_flat("exp_avg", info.dtype).template data<C>() + info.offset;
      C* v = state_flat("exp_avg_sq", info.dtype).template data<C>() + info.offset;
      const auto k = make_lamb_coeffs<C>(c.beta1, c.beta2, c.eps, c.weight_decay, c.bias_correction, t);
      Sums s = chunked_reduce<Sums>(n, [&](std::int64_t b, std::int64_t e) { return lamb_pass1(p, g, m, v, b, e, k); });
      sums[2 * i] = s.w;
      sums[2 * i + 1] = s.u;
    });
  }
  combine_sums(sums, 2);
  for (std::size_t i = 0; i < np; ++i) {
    const ParamInfo& info = arena().info(i);
    dispatch_floating(info.dtype, "lamb", [&](auto tag) {
      using T = decltype(tag);
      using C = compute_t<T>;
      const std::int64_t n = shape_numel(info.shape);
      T* p = arena().params_flat(info.dtype).template data<T>() + info.offset;
      const T* g = arena().grads_flat(info.dtype).template data<T>() + info.offset;
      C* m = state_flat("exp_avg", info.dtype).template data<C>() + info.offset;
      C* v = state_flat("exp_avg_sq", info.dtype).template data<C>() + info.offset;
      const bool dec = decays(i);
      const auto k = make_lamb_coeffs<C>(c.beta1, c.beta2, c.eps, dec ? c.weight_decay : 0.0, c.bias_correction, t);
      const double ratio = dec ? lamb_trust_ratio(std::sqrt(sums[2 * i]), std::sqrt(sums[2 * i + 1]), c.max_trust_ratio)
                               : 1.0;
      const C scaled_lr = C(lr * ratio);
      parallel_chunks(n, [&](std::int64_t b, std::int64_t e) {
        if (dec) lamb_pass2(p, m, v, b, e, k, scaled_lr);
        else lamb_single_pass(p, g, m, v, b, e, k, scaled_lr);
      });
    });
  }
}

}  // namespace ringtrain
