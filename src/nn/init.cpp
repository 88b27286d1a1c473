#include "init.hpp"

#include <cmath>
#include <vector>

#include "ringtrain/nn/rng.hpp"

namespace ringtrain::detail {

std::vector<float> init_values(std::size_t numel, std::size_t index, Init kind, double fan_in, double fan_out,
                               std::uint64_t seed) {
  std::vector<float> host(numel);
  const std::uint64_t stream = 0x1000 + index;
  const double two_pi = 6.283185307179586;
  auto uni = [&](std::size_t i) { return static_cast<double>(counter_uniform(seed, stream, i)); };
  switch (kind) {
    case Init::kaiming_uniform:
    case Init::xavier_uniform: {
      double bound = kind == Init::kaiming_uniform ? std::sqrt(6.0 / fan_in) : std::sqrt(6.0 / (fan_in + fan_out));
      for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((2 * uni(i) - 1) * bound);
      break;
    }
    case Init::kaiming_normal:
    case Init::xavier_normal: {
      double stdv = kind == Init::kaiming_normal ? std::sqrt(2.0 / fan_in) : std::sqrt(2.0 / (fan_in + fan_out));
      // Box-Muller on two counter draws per element (index 2i, 2i+1).
      for (std::size_t i = 0; i < host.size(); ++i) {
        double u1 = 1.0 - uni(2 * i), u2 = uni(2 * i + 1);  // u1 in (0, 1]
        host[i] = static_cast<float>(stdv * std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2));
      }
      break;
    }
  }
  return host;
}

void init_weight(const ParamArena& arena, std::size_t index, Init kind, double fan_in, double fan_out,
                 std::uint64_t seed) {
  Tensor p = arena.param(index);
  RT_CHECK(p.dtype() == DType::f32, "init of parameter '", arena.info(index).name, "': only float32 is supported");
  std::vector<float> host = init_values(static_cast<std::size_t>(p.numel()), arena.model_index(index), kind, fan_in, fan_out, seed);
  p.copy_from(Tensor::wrap(host.data(), p.shape(), DType::f32));
}

void init_normal(const ParamArena& arena, std::size_t index, double stdv, std::uint64_t seed) {
  // xavier_normal's std is sqrt(2 / (fan_in + fan_out)): pick the fans that give stdv.
  init_weight(arena, index, Init::xavier_normal, 1.0 / (stdv * stdv), 1.0 / (stdv * stdv), seed);
}

void fill_tensor(Tensor& t, double value) {
  if (t.device().is_cpu()) {
    t.fill_(value);
    return;
  }
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  h.fill_(value);
  t.copy_from(h);
}

void fill_param(const ParamArena& arena, std::size_t index, double value) {
  Tensor p = arena.param(index);
  fill_tensor(p, value);
}

}  // namespace ringtrain::detail
