// Gradient unscaling, finiteness check, global norm and clipping over every
// flat gradient buffer of the arena (padding is zero and stays zero).
#include "ringtrain/optim/grad_utils.hpp"

#include <cmath>

#include "cpu_loops.hpp"

namespace ringtrain {

using namespace optim_math;
using optim_detail::chunked_reduce;
using optim_detail::dispatch_floating;

namespace {
void check_cpu(const ParamArena& a, const char* what) {
  RT_CHECK(a.finalized(), what, ": the parameter arena is not finalised");
  RT_CHECK(a.device().is_cpu(), what, ": needs a CPU arena, got ", a.device().str());
}

// Multiplies every gradient by factor (skipped when factor == 1); returns the
// number of non-finite gradients after scaling.
std::int64_t scale_and_count(const ParamArena& a, double factor, const char* what) {
  std::int64_t bad = 0;
  for (DType dt : a.dtypes()) {
    Tensor flat = a.grads_flat(dt);
    dispatch_floating(dt, what, [&](auto tag) {
      using T = decltype(tag);
      using C = compute_t<T>;
      T* g = flat.template data<T>();
      const C f = C(factor);
      const bool scale = factor != 1.0;
      bad += chunked_reduce<std::int64_t>(flat.numel(), [&](std::int64_t b, std::int64_t e) {
        std::int64_t nb = 0;
        for (std::int64_t j = b; j < e; ++j) {
          C x = load(g[j]);
          if (scale) {
            x = scale_grad(x, f);
            store(g[j], x);
          }
          nb += is_finite(x) ? 0 : 1;
        }
        return nb;
      });
    });
  }
  return bad;
}
}  // namespace

bool unscale_grads(ParamArena& arena, double inv_scale) {
  check_cpu(arena, "unscale_grads");
  RT_CHECK(std::isfinite(inv_scale) && inv_scale > 0, "unscale_grads: inv_scale must be finite and > 0, got ", inv_scale);
  return scale_and_count(arena, inv_scale, "unscale_grads") == 0;
}

bool grads_finite(const ParamArena& arena) {
  check_cpu(arena, "grads_finite");
  return scale_and_count(arena, 1.0, "grads_finite") == 0;
}

double grad_sq_norm(const ParamArena& arena, const std::vector<char>& include) {
  check_cpu(arena, "grad_sq_norm");
  RT_CHECK(include.empty() || include.size() == arena.size(), "grad_sq_norm: selection of ", include.size(),
           " entries for ", arena.size(), " parameters");
  double sq = 0.0;
  // Sums run over spans of the flat buffers in fixed chunks: the same bits for any thread count.
  auto span = [&](DType dt, std::int64_t first, std::int64_t n) {
    Tensor flat = arena.grads_flat(dt).flat_view(first, n);
    dispatch_floating(dt, "grad_sq_norm", [&](auto tag) {
      using T = decltype(tag);
      const T* g = flat.template data<T>();
      sq += chunked_reduce<double>(n, [&](std::int64_t b, std::int64_t e) { return optim_detail::sum_squares(g, b, e); });
    });
  };
  if (include.empty()) {
    for (DType dt : arena.dtypes()) span(dt, 0, arena.grads_flat(dt).numel());
    return sq;
  }
  for (std::size_t i = 0; i < arena.size(); ++i)
    if (include[i]) span(arena.info(i).dtype, static_cast<std::int64_t>(arena.info(i).offset), shape_numel(arena.info(i).shape));
  return sq;
}

double grad_global_norm(const ParamArena& arena) { return std::sqrt(grad_sq_norm(arena)); }

double clip_grad_norm(ParamArena& arena, double max_norm) {
  RT_CHECK(std::isfinite(max_norm) && max_norm > 0, "clip_grad_norm: max_norm must be finite and > 0, got ", max_norm);
  const double total = grad_global_norm(arena);
  const double coef = clip_coefficient(total, max_norm);
  if (coef < 1.0) scale_and_count(arena, coef, "clip_grad_norm");
  return total;
}

}  // namespace ringtrain
