// Latency-optimised algorithms: recursive-doubling all-reduce and the
// broadcasts.
//
// Why recursive doubling for small messages: a small message is latency bound
// (a >> n b), and recursive doubling takes lg p message latencies (plus 2 for
// the fold when p is not a power of two) against the ring's 2(p-1); each step
// moves the whole vector, which only matters once n b is comparable to a, and
// that is where `automatic` switches to the ring. A binomial reduce + broadcast
// would take 2 lg p; a double binary tree only pays off at scale, for large
// messages we already give to the ring.
#include "ringtrain/comm/algorithms.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain {

void tree_allreduce(Primitives& P, const void* in, void* out, std::size_t count, int divisor) {
  int p = P.size(), r = P.rank();
  if (p == 1) {
    P.copy(out, in, count);
    return;
  }
  int pof2 = 1;
  while (pof2 * 2 <= p) pof2 *= 2;
  int rem = p - pof2;

  // Fold: among the first 2*rem ranks, each even rank hands its data to the odd
  // rank above it and waits for the result; the rest renumber to 0..pof2-1.
  int vr;  // rank in the power-of-two group, or -1 when folded away
  const void* cur = in;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      P.send(r + 1, in, count);
      vr = -1;
    } else {
      // Operands: the lower (even) rank's data on the left.
      P.recv_reduce_copy(r - 1, in, out, count);
      cur = out;
      vr = r / 2;
    }
  } else {
    vr = r - rem;
  }
  auto real = [&](int v) { return v < rem ? 2 * v + 1 : v + rem; };

  if (vr >= 0) {
    for (int mask = 1; mask < pof2; mask <<= 1) {
      int partner = real(vr ^ mask);
      bool last = mask * 2 == pof2;
      // Left operand = lower rank's data on both sides: a+b computed identically.
      P.exchange_reduce(partner, cur, out, count, last ? divisor : 1);
      cur = out;
    }
    if (r < 2 * rem) P.send(r - 1, out, count);
  } else {
    P.recv(r + 1, out, count);
  }
  P.finish();
}

void binomial_broadcast(Primitives& P, void* buf, std::size_t count, int root) {
  int p = P.size(), r = P.rank();
  if (p == 1 || count == 0) return;
  int vr = (r - root + p) % p;
  auto real = [&](int v) { return (v + root) % p; };
  // Receive from the parent (vr with its lowest set bit cleared) ...
  int mask = 1;
  while (mask < p) {
    if (vr & mask) {
      P.recv(real(vr - mask), buf, count);
      break;
    }
    mask <<= 1;
  }
  // ... then send to children vr + m for every m below that bit, largest first.
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < p) P.send(real(vr + mask), buf, count);
  P.finish();
}

void chain_broadcast(Primitives& P, void* buf, std::size_t count, int root) {
  int p = P.size(), r = P.rank();
  if (p == 1 || count == 0) return;
  int vr = (r - root + p) % p;
  int next = (r + 1) % p, prev = (r - 1 + p) % p;
  if (vr == 0) P.send(next, buf, count);
  else if (vr == p - 1) P.recv(prev, buf, count);
  else P.recv_copy_send(prev, next, buf, count);
  P.finish();
}

}  // namespace ringtrain
