// SGD and Adam/AdamW on the CPU: one pass per parameter view, element math
// from update_math.hpp, OpenMP over chunks of large tensors.
#include "cpu_loops.hpp"
#include "ringtrain/optim/optimizer.hpp"

namespace ringtrain {

using namespace optim_math;
using optim_detail::dispatch_floating;
using optim_detail::parallel_chunks;

namespace {
// Element loops over [b, e): restrict pointers and by-value coefficients let
// GCC hoist the uniform branches and vectorise.
template <typename T, typename C>
void sgd_kernel(T* __restrict p, const T* __restrict g, C* __restrict buf, std::int64_t b, std::int64_t e,
                SgdCoeffs<C> k) {
  for (std::int64_t j = b; j < e; ++j) {
    C pj = load(p[j]);
    sgd_update(pj, load(g[j]), buf[j], k);
    store(p[j], pj);
  }
}
template <typename T, typename C>
void sgd_kernel_nobuf(T* __restrict p, const T* __restrict g, std::int64_t b, std::int64_t e, SgdCoeffs<C> k) {
  for (std::int64_t j = b; j < e; ++j) {
    C pj = load(p[j]), unused = C(0);
    sgd_update(pj, load(g[j]), unused, k);
    store(p[j], pj);
  }
}
template <typename T, typename C>
void adam_kernel(T* __restrict p, const T* __restrict g, C* __restrict m, C* __restrict v, std::int64_t b,
                 std::int64_t e, AdamCoeffs<C> k) {
  for (std::int64_t j = b; j < e; ++j) {
    C pj = load(p[j]);
    adam_update(pj, load(g[j]), m[j], v[j], k);
    store(p[j], pj);
  }
}
}  // namespace

Sgd::Sgd(ParamArena& arena, OptimizerConfig cfg) : Optimizer(arena, std::move(cfg), "sgd") {
  require_cpu();
  if (config().momentum != 0.0) add_state("momentum_buffer");
}

void Sgd::update(double lr, std::int64_t t) {
  const OptimizerConfig& c = config();
  const bool has_buf = c.momentum != 0.0;
  for (std::size_t i = 0; i < arena().size(); ++i) {
    const ParamInfo& info = arena().info(i);
    dispatch_floating(info.dtype, "sgd", [&](auto tag) {
      using T = decltype(tag);
      using C = compute_t<T>;
      T* p = arena().params_flat(info.dtype).template data<T>() + info.offset;
      const T* g = arena().grads_flat(info.dtype).template data<T>() + info.offset;
      C* buf = has_buf ? state_flat("momentum_buffer", info.dtype).template data<C>() + info.offset : nullptr;
      const auto k = make_sgd_coeffs<C>(lr, decays(i) ? c.weight_decay : 0.0, c.momentum, c.dampening, c.nesterov, t);
      parallel_chunks(shape_numel(info.shape), [&](std::int64_t b, std::int64_t e) {
        if (buf) sgd_kernel(p, g, buf, b, e, k);
        else sgd_kernel_nobuf(p, g, b, e, k);
      });
    });
  }
}

Adam::Adam(ParamArena& arena, OptimizerConfig cfg, bool decoupled)
    : Optimizer(arena, std::move(cfg), decoupled ? "adamw" : "adam"), decoupled_(decoupled) {
  require_cpu();
  add_state("exp_avg");
  add_state("exp_avg_sq");
}

void Adam::update(double lr, std::int64_t t) {
  const OptimizerConfig& c = config();
  for (std::size_t i = 0; i < arena().size(); ++i) {
    const ParamInfo& info = arena().info(i);
    dispatch_floating(info.dtype, name().c_str(), [&](auto tag) {
      using T = decltype(tag);
      using C = compute_t<T>;
      T* p = arena().params_flat(info.dtype).template data<T>() + info.offset;
      const T* g = arena().grads_flat(info.dtype).template data<T>() + info.offset;
      C* m = state_flat("exp_avg", info.dtype).template data<C>() + info.offset;
      C* v = state_flat("exp_avg_sq", info.dtype).template data<C>() + info.offset;
      const auto k = make_adam_coeffs<C>(lr, c.beta1, c.beta2, c.eps, decays(i) ? c.weight_decay : 0.0,
                                         decoupled_, t);
      parallel_chunks(shape_numel(info.shape), [&](std::int64_t b, std::int64_t e) { adam_kernel(p, g, m, v, b, e, k); });
    });
  }
}

}  // namespace ringtrain
