#pragma once
// Context parallelism (parallel.context = P): the tokens of every sequence are
// split over the P ranks of the mesh's `context` group.
//
// Load balance for the causal mask (Megatron-Core's and PyTorch's head-tail
// split): the sequence of T tokens, padded to 2P·c (c = ceil(T / 2P)), is cut
// into 2P chunks of c tokens; rank r holds chunks r and 2P−1−r, in that order,
// so its 2c local tokens cost the same attention work on every rank. The
// padding (positions >= T) lies at the end of chunk 2P−1 (rank 0's tail): a
// real token never attends to it (causal), and the loss leaves it out.
//
// Which layers change (shard_context, applied by the model builder):
//  - TokenEmbedding takes the whole ids [N, T], keeps this rank's tokens and
//    adds the position embedding of their global positions: [N, 2c, D];
//  - every other layer works on [N, 2c, D] unchanged, Dropout numbering its
//    elements as in the whole [N, T, D] activation (masks equal 1 rank's);
//  - sequence parallelism (tensor > 1): tensor rank t takes local tokens
//    [t·2c/tensor, (t+1)·2c/tensor) where the blocks shard tokens (the
//    embedding reduce-scatters to them, Dropout numbers them by chunk);
//  - causal MultiHeadSelfAttention runs ring attention (ring_attention below);
//  - the loss (context_loss) takes this rank's logits [N, 2c, V] and the whole
//    labels [N, T], reduces (sum, count) over the group once, and returns the
//    sequence's mean; its gradient is scaled by P because the gradient
//    synchronisation averages over data × context (ParamInfo::reduce_over).
//
// Ring attention (forward): each rank keeps its queries; the K/V block of every
// rank travels the ring (rank r sends to r+1, receives from r−1) in P−1
// bounded point-to-point steps, the transfer of the next block overlapped with
// the attention on the block in hand; the partial results merge by their
// running row maximum and sum (the online softmax of the tiled kernel), so the
// output and its row log-sum-exp equal full causal attention. Backward: the K/V
// blocks travel again and each block's dK/dV accumulator travels with it, one
// step behind, and arrives home after P transfers. A key is visible to a query
// when its global position is not later; within a block positions ascend, so
// the visible keys of a query row are a prefix of the block.
//
// All-to-all (DeepSpeed-Ulysses, parallel.context_mode = alltoall): the
// same token split, but each causal attention exchanges its q/k/v with one
// all-to-all over the group (comm/alltoall.hpp, bounded), so that rank j holds
// every token of heads [j·H/P, (j+1)·H/P) (H: this rank's heads, after any
// tensor split), placed at their global positions (the head-tail chunks
// undone, the padding at the end); it runs the backend's ordinary causal
// kernel there and a second all-to-all brings each rank its tokens' output.
// Backward: dO gathered the same way, dQ/dK/dV scattered back. Needs P | H.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/layer.hpp"
#include "ringtrain/nn/loss.hpp"

namespace ringtrain {

// parallel.context_mode: how the attention crosses the token shards.
enum class ContextMode { ring, alltoall };
// "ring" | "alltoall"; an Error naming the key otherwise.
ContextMode parse_context_mode(const std::string& s);

// What the ring (or the all-to-all) measured (benchmarks; shared by every copy of a group).
struct RingStats {
  double compute_s = 0;   // attention arithmetic, forward and backward
  double compute_cpu_s = 0;  // the same in the calling thread's CPU time (one OpenMP thread: preemption-free)
  double wait_s = 0;      // ring: waiting for blocks after the arithmetic of a step; all-to-all: the exchanges
  double bytes_sent = 0;  // payload this rank sent, forward and backward
  double fwd_bytes_sent = 0;
  std::int64_t forwards = 0, backwards = 0;
  void reset() { *this = RingStats{}; }
};

// The ring's buffers within one call: the K/V block in hand and the one
// arriving, the backward's dK/dV part and accumulators in flight, the threads'
// score tiles. One per group, shared by every layer built with it (layers run
// one at a time), so a deeper model holds them once; not micro-batch state.
// The all-to-all mode's exchange buffers and the gathered sequence of this
// rank's heads (q/k/v, output, their gradients) are likewise the group's;
// a2a_fill counts the fills of a2a_qkv/a2a_out (which layer's they hold).
struct RingWorkspace {
  Tensor kv[2], part, dsend, drecv, scratch;
  Tensor a2a[4], a2a_qkv, a2a_out, a2a_dout, a2a_dqkv;  // a2a: send, receive (and their host copies on a device)
  // Ring attention: the running row maximum and sum (forward), the rows' D
  // (backward), and on a device the host copies that stage the transfers
  // (K/V send, receive; dK/dV send, receive).
  Tensor ring_m, ring_l, ring_d, ring_host[4];
  std::uint64_t a2a_fill = 0;
  std::size_t bytes() const;
};

struct ContextGroup {
  Communicator comm;  // the mesh's context group (unused at size 1)
  int size = 1, rank = 0;
  std::int64_t seq = 0;  // T: the whole sequence's tokens (the model's seq_len)
  ContextMode mode = ContextMode::ring;  // parallel.context_mode
  // Benchmarks only: rank r holds chunks 2r and 2r+1 (no load balance).
  bool contiguous = false;
  std::shared_ptr<RingStats> stats;  // optional
  std::shared_ptr<RingWorkspace> work = std::make_shared<RingWorkspace>();  // shared by its copies
  static ContextGroup of(const Communicator& c, std::int64_t seq, std::shared_ptr<RingStats> s = nullptr);
  std::int64_t chunk() const { return (seq + 2 * size - 1) / (2 * size); }
  std::int64_t local() const { return 2 * chunk(); }  // tokens per sample on a rank, padding included
  int chunk_of(int r, int k) const { return contiguous ? 2 * r + k : (k == 0 ? r : 2 * size - 1 - r); }
  // The global position of rank r's local token i (>= seq: padding).
  std::int64_t position(int r, std::int64_t i) const {
    const std::int64_t c = chunk();
    return std::int64_t(chunk_of(r, int(i / c))) * c + i % c;
  }
  // This rank's real tokens per sample (the rest of local() is padding).
  std::int64_t real(int r) const;
};

// The attention core of a causal MultiHeadSelfAttention over g (float32): the
// block arithmetic is the Backend's ring_block_* ops on qkv's device (a
// device's transfers staged through host copies).
std::unique_ptr<AttentionKernel> ring_attention(const AttentionSpec& s, const ContextGroup& g);
// The all-to-all (Ulysses) core: `inner` runs the causal attention of H/P
// heads on the whole sequence (be.attention). An Error naming the head count
// unless g.size divides s.heads.
std::unique_ptr<AttentionKernel> alltoall_attention(const AttentionSpec& s, const ContextGroup& g, Backend& be);
// The core g.mode asks for.
std::unique_ptr<AttentionKernel> context_attention(const AttentionSpec& s, const ContextGroup& g, Backend& be);

// Gives the layers (and their children) their part of the context group: the
// model builder calls it when g.size > 1. An Error naming the layer for a
// layer that cannot run on a token shard (a non-causal attention, a
// tensor-parallel or sequence-parallel layer, TokenMean).
void shard_context(std::vector<LayerPtr>& layers, const ContextGroup& g);

// The loss of a context-parallel model's output (see above); inner is the
// whole model's per-row loss (softmax cross-entropy), applied to the rows of
// this rank's real tokens.
LossPtr context_loss(LossPtr inner, const ContextGroup& g);

// This rank's tokens of a whole [N, T, ...] tensor: [N, 2c, ...], padding zero.
Tensor context_slice(const Tensor& whole, const ContextGroup& g);
// The shape of that slice (an Error unless whole[1] == g.seq).
Shape context_shape(const Shape& whole, const ContextGroup& g);

}  // namespace ringtrain
