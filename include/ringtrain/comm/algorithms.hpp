#pragma once
// Collective algorithms, written once over Primitives (comm/primitives.hpp), so
// the host path and the device path run the same step logic. Each function is
// called by every rank of the Primitives' group with the same arguments (counts,
// root) and leaves no send outstanding when it returns.
// Rules:
//  - Chunks/blocks are split identically on every rank (ring_chunks).
//  - Every element's final value is computed by exactly one rank (ring) or by
//    both partners from the same operands in the same order (recursive doubling),
//    so every rank ends with bitwise-identical results.
//  - avg: `divisor` (the rank count) is applied once, fused into the last combine.
#include <cstddef>
#include <vector>

#include "ringtrain/comm/primitives.hpp"

namespace ringtrain {

// [offset, offset + count) of each of p chunks of `count` elements: equal chunks
// rounded up to 64-byte multiples (aligned reductions), the tail chunks possibly empty.
std::vector<std::size_t> ring_chunks(std::size_t count, int p, std::size_t elem_size);  // p + 1 offsets

// Ring all-reduce: reduce-scatter then all-gather, 2(p-1) steps, each chunk
// segmented and pipelined by the primitives. Bandwidth-optimal:
// 2(p-1)a + 2(p-1)/p n b + (p-1)/p n g. `in` may equal `out`.
void ring_allreduce(Primitives& P, const void* in, void* out, std::size_t count, int divisor);

// Recursive-doubling all-reduce (see tree.cpp for why).
void tree_allreduce(Primitives& P, const void* in, void* out, std::size_t count, int divisor);

// Ring reduce-scatter over blocks of `counts` (rank r keeps block r in `out`).
void ring_reduce_scatter(Primitives& P, const void* in, void* out, const std::vector<std::size_t>& counts,
                         int divisor);

// Ring all-gather of variable blocks: rank r's block is already at displs[r] of
// `out` (the caller copies it there); p-1 pipelined forwarding steps.
void ring_allgatherv(Primitives& P, void* out, const std::vector<std::size_t>& counts);

// Broadcast from `root`: a binomial tree (lg p message latencies; small messages)
// or a pipelined chain (root -> root+1 -> ...; every link carries n once and the
// segments overlap, so the time tends to n b for large messages, versus about
// 2n b for scatter + all-gather over shared memory).
void binomial_broadcast(Primitives& P, void* buf, std::size_t count, int root);
void chain_broadcast(Primitives& P, void* buf, std::size_t count, int root);

}  // namespace ringtrain
