#pragma once
// Host-side parameter initialisation from the counter RNG (nn/rng.hpp): values
// depend on (seed, parameter index, element index) only, so every rank, thread
// count and device gets identical starting weights.
#include <cstdint>
#include <vector>

#include "ringtrain/nn/layer.hpp"

namespace ringtrain::detail {

// The values init_weight writes into a parameter of `numel` elements at arena
// `index` (tensor-parallel layers take their shard of the whole weight's values).
std::vector<float> init_values(std::size_t numel, std::size_t index, Init kind, double fan_in, double fan_out,
                               std::uint64_t seed);
void init_weight(const ParamArena& arena, std::size_t index, Init kind, double fan_in, double fan_out,
                 std::uint64_t seed);
// N(0, stdv^2) from the same counter RNG (e.g. position embeddings, std 0.02).
void init_normal(const ParamArena& arena, std::size_t index, double stdv, std::uint64_t seed);
// A sharded parameter's part of the whole weight's init_weight values (arena.info(index).shard).
void init_shard(const ParamArena& arena, std::size_t index, Init kind, double fan_in, double fan_out,
                std::uint64_t seed);
void fill_param(const ParamArena& arena, std::size_t index, double value);
void fill_tensor(Tensor& t, double value);  // any device (staged through the host)

}  // namespace ringtrain::detail
