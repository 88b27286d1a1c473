#pragma once
// Node-aware all-reduce: `shm` (ranks of one node through shared memory) and
// `hierarchical` (shared memory inside each node, the ring/tree primitives
// between nodes). Called by allreduce() (collectives.cpp) after its argument
// checks; every rank of `comm` calls with the same count, dtype and op.
//
// Shared memory, per communicator (created at its first node-aware all-reduce,
// kept in an MPI attribute, freed with the communicator):
//  - Each rank of a node creates one POSIX segment "/ringtrain-<pid>-<serial>"
//    (pids are unique on the machine, so two jobs never collide), the node's ranks
//    map each other's, and each rank unlinks its own once all have attached: after
//    that no exit path, crash included, can leave a segment in /dev/shm.
//  - A segment = one cache line holding the rank's sequence counter, then two data
//    slots. The counter is written only by its owner (release) and read by peers
//    (acquire); every rank takes the same steps, so "peer finished step s" is
//    "peer's counter >= s". The slot alternates per chunk, and a rank publishes
//    the next chunk's input only after it finished reading the previous one, so a
//    slot is never overwritten while a peer still reads it: no second barrier.
//  - No MPI call on the data path. A wait spins, then yields (calling MPI_Iprobe so
//    that this rank's pending non-blocking sends, e.g. a pipeline stage's, progress:
//    the peer may be waiting for one), then sleeps; it checks that the
//    peers' processes are alive, and ends the job with a message naming the rank
//    that died or stalled (Communicator::timeout_s) instead of hanging.
//
// Data path for n bytes on p ranks of a node (memory passes per rank):
//  - n <= small threshold: copy in (R n, W n); reduce all p inputs, in rank
//    order, straight into the output (R p n, W n). Every rank computes every
//    element from the same operands in the same order: identical bits.
//  - otherwise, in slot-sized chunks: copy in the slices the peers reduce
//    (R, W (p-1)n/p); rank r reduces slice r of every rank's chunk (its own
//    straight from its input) in one pass over L1-sized blocks and writes the
//    result to its output and its slot (R n, W 2n/p); then copies the other
//    p-1 slices from their owners' slots (R, W (p-1)n/p). In all R (3p-2)n/p +
//    W 2n. Each element is reduced by exactly one rank: identical bits everywhere.
//  - hierarchical: the same chunks, with the reduced slices all-reduced across
//    nodes (slice s among the ranks that own slice s on their node: local index
//    s mod local size, so uneven nodes work) before the copy-out.
// avg: the division by the communicator's size is fused into the last combine.
#include <cstddef>
#include <vector>

#include "ringtrain/comm/collectives.hpp"

namespace ringtrain {

// One-round path up to this many bytes (CollectiveOptions::shm_small_bytes overrides).
constexpr std::size_t kDefaultShmSmallBytes = 64 * 1024;
// Chunk (= slot) size of the large-message path (CollectiveOptions::shm_chunk_bytes overrides).
constexpr std::size_t kDefaultShmChunkBytes = 1024 * 1024;

void shm_allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                   const Communicator& comm, const CollectiveOptions& opt);
void hierarchical_allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                            const Communicator& comm, const CollectiveOptions& opt);

// Reduce-scatter on one node through the same slots (recv = this rank's block of
// counts[rank] elements): every element bitwise equal to shm_allreduce's result
// (same operands, same rank order). Used by ZeRO-1 (optim/sharded_optimizer.hpp),
// so a sharded run averages gradients exactly as the engine's shm all-reduce does.
void shm_reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype,
                        ReduceOp op, const Communicator& comm, const CollectiveOptions& opt);

// Bytes this rank has sent to ranks on other nodes through the node-aware
// algorithms of `comm` since its creation (the benchmark compares them with the
// minimum 2(N-1)/N n per node pair).
std::size_t cross_node_bytes_sent(const Communicator& comm);

}  // namespace ringtrain
