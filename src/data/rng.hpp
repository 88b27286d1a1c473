#pragma once
// Defined random streams for the data pipeline. std::mt19937_64's output is
// fixed by the C++ standard, but std::uniform_int_distribution and
// std::shuffle are not (they differ across standard libraries), so bounded
// draws and the Fisher–Yates shuffle are written here: permutations and
// augmentations are identical on every build.
#include <cstdint>
#include <random>
#include <vector>

namespace ringtrain::data {

inline std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A seed for stream (a, b, c, d): hashes the tuple, so nearby tuples give unrelated streams.
inline std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b = 0, std::uint64_t c = 0, std::uint64_t d = 0) {
  std::uint64_t s = a;
  std::uint64_t h = splitmix64(s);
  for (std::uint64_t v : {b, c, d}) {
    s = h ^ (v + 0x632be59bd9b4e019ull);
    h = splitmix64(s);
  }
  return h;
}

// Uniform in [0, n) without modulo bias (rejection on the 64-bit range).
template <typename Rng>
std::uint64_t uniform_below(Rng& rng, std::uint64_t n) {
  const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % n);
  std::uint64_t x;
  do x = rng();
  while (x >= limit);
  return x % n;
}

// Fisher–Yates: the same permutation everywhere for the same rng state.
template <typename T, typename Rng>
void shuffle(std::vector<T>& v, Rng& rng) {
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[uniform_below(rng, i)]);
}

}  // namespace ringtrain::data
