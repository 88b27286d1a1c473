#pragma once
// Counter-based random numbers shared by every device: a value depends only on
// (seed, stream, index), never on thread count or call order, so dropout masks
// are identical on the CPU and the GPU and across runs with the same seed.
#include <cstdint>

#include "ringtrain/core/hd.hpp"

namespace ringtrain {

// splitmix64's finaliser: a bijective 64-bit mix.
RT_HD std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 24 random bits (exact in float32).
RT_HD float counter_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  std::uint64_t h = mix64(mix64(seed ^ mix64(stream)) + index);
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

RT_HD bool dropout_keep(std::uint64_t seed, std::uint64_t stream, std::uint64_t index, float p) {
  return counter_uniform(seed, stream, index) >= p;
}

}  // namespace ringtrain
