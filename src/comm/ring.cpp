// Ring algorithms over the primitives. Rank r sends to r+1 and receives from r-1.
// Chunk indices below are taken mod p; in the reduce-scatter, step s sends chunk
// r-1-s and receives chunk r-2-s, so rank r ends owning chunk r; the all-gather
// then circulates chunk r-s at step s.
#include <algorithm>
#include <numeric>

#include "ringtrain/comm/algorithms.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain {
namespace {

int mod(int a, int p) { return ((a % p) + p) % p; }

}  // namespace

std::vector<std::size_t> ring_chunks(std::size_t count, int p, std::size_t elem_size) {
  std::size_t unit = std::max<std::size_t>(1, 64 / elem_size);
  std::size_t per = (count + p - 1) / p;
  per = (per + unit - 1) / unit * unit;
  std::vector<std::size_t> off(p + 1);
  for (int c = 0; c <= p; ++c) off[c] = std::min(count, per * c);
  return off;
}

void ring_allreduce(Primitives& P, const void* in, void* out, std::size_t count, int divisor) {
  int p = P.size(), r = P.rank();
  std::size_t es = P.elem_size();
  if (p == 1) {
    P.copy(out, in, count);  // avg over one rank: the divisor is 1
    return;
  }
  auto off = ring_chunks(count, p, es);
  auto n = [&](int c) { return off[mod(c, p) + 1] - off[mod(c, p)]; };
  auto I = [&](int c) { return static_cast<const char*>(in) + off[mod(c, p)] * es; };
  auto O = [&](int c) { return static_cast<char*>(out) + off[mod(c, p)] * es; };
  int next = mod(r + 1, p), prev = mod(r - 1, p);

  // Reduce-scatter: partial sums travel the ring, stored in `out` as they pass.
  P.send(next, I(r - 1), n(r - 1));
  for (int s = 1; s < p - 1; ++s) P.recv_reduce_copy_send(prev, next, I(r - 1 - s), O(r - 1 - s), n(r - 1 - s));
  // The last combine of chunk r finishes it (and avg's division) and starts the all-gather.
  P.recv_reduce_copy_send(prev, next, I(r), O(r), n(r), divisor);
  for (int s = 1; s < p - 1; ++s) P.recv_copy_send(prev, next, O(r - s), n(r - s));
  P.recv(prev, O(r + 1), n(r + 1));
  P.finish();
}

void ring_reduce_scatter(Primitives& P, const void* in, void* out, const std::vector<std::size_t>& counts,
                         int divisor) {
  int p = P.size(), r = P.rank();
  std::size_t es = P.elem_size();
  RT_ASSERT(static_cast<int>(counts.size()) == p);
  std::vector<std::size_t> off(p + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), off.begin() + 1);
  auto n = [&](int c) { return counts[mod(c, p)]; };
  auto I = [&](int c) { return static_cast<const char*>(in) + off[mod(c, p)] * es; };
  if (p == 1) {
    P.copy(out, I(0), n(0));
    return;
  }
  int next = mod(r + 1, p), prev = mod(r - 1, p);
  if (p > 2) P.reserve_blocks(*std::max_element(counts.begin(), counts.end()));
  P.send(next, I(r - 1), n(r - 1));
  for (int s = 1; s < p - 1; ++s) P.recv_reduce_copy_send(prev, next, I(r - 1 - s), P.block(s), n(r - 1 - s));
  P.recv_reduce_copy(prev, I(r), out, n(r), divisor);
  P.finish();
}

void ring_allgatherv(Primitives& P, void* out, const std::vector<std::size_t>& counts) {
  int p = P.size(), r = P.rank();
  std::size_t es = P.elem_size();
  RT_ASSERT(static_cast<int>(counts.size()) == p);
  if (p == 1) return;
  std::vector<std::size_t> off(p + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), off.begin() + 1);
  auto n = [&](int c) { return counts[mod(c, p)]; };
  auto O = [&](int c) { return static_cast<char*>(out) + off[mod(c, p)] * es; };
  int next = mod(r + 1, p), prev = mod(r - 1, p);
  P.send(next, O(r), n(r));
  for (int s = 1; s < p - 1; ++s) P.recv_copy_send(prev, next, O(r - s), n(r - s));
  P.recv(prev, O(r + 1), n(r + 1));
  P.finish();
}

}  // namespace ringtrain
