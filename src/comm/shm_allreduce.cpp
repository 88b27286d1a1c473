// The node-aware all-reduces' data path (protocol and memory passes in
// include/ringtrain/comm/shm.hpp). No MPI call here except the inter-node step
// of `hierarchical`, which runs the ring/tree algorithms over the primitives.
#include <algorithm>
#include <cstring>

#include "ringtrain/comm/algorithms.hpp"
#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/comm/shm.hpp"
#include "ringtrain/core/error.hpp"
#include "shm_node.hpp"

namespace ringtrain {
namespace {

using shm_detail::ShmNode;

// Counts what the inter-node groups send: every peer of a slice group is on another node.
class CountingTransport final : public Transport {
 public:
  CountingTransport(Transport& t, std::size_t& bytes) : t_(t), bytes_(bytes) {}
  int rank() const override { return t_.rank(); }
  int size() const override { return t_.size(); }
  Request isend(const void* buf, std::size_t bytes, int peer) override {
    bytes_ += bytes;
    return t_.isend(buf, bytes, peer);
  }
  Request irecv(void* buf, std::size_t bytes, int peer) override { return t_.irecv(buf, bytes, peer); }
  void wait(Request& r) override { t_.wait(r); }
  bool test(Request& r) override { return t_.test(r); }

 private:
  Transport& t_;
  std::size_t& bytes_;
};

struct Call {
  ShmNode& node;
  const char* what;
  DType dtype;
  ReduceOp op;
  std::size_t es;
  CpuReducer red;
  const CollectiveOptions& opt;
};

// out[0, n) = op over srcs[0..p) (in that order; the divisor on the last combine),
// one L1-sized block at a time so each source is read once from memory, and the
// partial result never leaves the cache. Optionally also copies the result to `copy`.
void reduce_sources(Call& c, char* out, char* copy, const char* const* srcs, int p, std::size_t n, int divisor) {
  std::size_t block = std::max<std::size_t>(1, (16 * 1024) / c.es);
  auto* acc = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(c.node.block.data()) + 63) & ~std::uintptr_t{63});
  for (std::size_t i = 0; i < n; i += block) {
    std::size_t b = std::min(block, n - i), off = i * c.es, bytes = b * c.es;
    if (p == 1) {
      c.red.copy(out + off, srcs[0] + off, bytes);
      if (divisor > 1) c.red.divide(out + off, b, c.dtype, divisor);
    } else {
      const char* left = srcs[0] + off;
      for (int j = 1; j < p - 1; ++j) {
        c.red.reduce(acc, left, srcs[j] + off, b, c.dtype, c.op, 1);
        left = acc;
      }
      c.red.reduce(out + off, left, srcs[p - 1] + off, b, c.dtype, c.op, divisor);
    }
    if (copy) std::memcpy(copy + off, out + off, bytes);
  }
}

// All-reduce of out[0, n) in place among the slice's group on the other nodes.
void cross_allreduce(Call& c, MPI_Comm group, char* out, std::size_t n, int divisor) {
  ShmNode& nd = c.node;
  MpiTransport mt(group, kTagRing, c.what, nd.comm_name.c_str(), nd.timeout_s, nd.spin_s);
  CountingTransport t(mt, nd.cross_bytes);
  Primitives::Config cfg;
  cfg.dtype = c.dtype;
  cfg.op = c.op;
  cfg.segment_bytes = effective_segment_bytes(c.opt);
  Primitives P(t, c.red, nd.cross_ws, cfg);
  if (static_cast<long long>(n * c.es) <= effective_tree_threshold(c.opt)) tree_allreduce(P, out, out, n, divisor);
  else ring_allreduce(P, out, out, n, divisor);
}

// One round: every rank reduces every peer's whole input into its output.
void one_round(Call& c, const char* in, char* out, std::size_t count, int divisor) {
  ShmNode& nd = c.node;
  std::size_t bytes = count * c.es;
  std::memcpy(nd.slot(nd.lrank, nd.use), in, bytes);
  nd.publish();
  nd.wait_peers(c.what);
  const char* srcs[64];
  std::vector<const char*> many;
  const char** s = nd.lsize <= 64 ? srcs : (many.resize(nd.lsize), many.data());
  for (int j = 0; j < nd.lsize; ++j) s[j] = j == nd.lrank ? in : nd.slot(j, nd.use);
  reduce_sources(c, out, nullptr, s, nd.lsize, count, divisor);
  ++nd.use;
}

// Chunked reduce-scatter (+ inter-node all-reduce) + all-gather through the slots.
void chunked(Call& c, const char* in, char* out, std::size_t count, bool across_nodes) {
  ShmNode& nd = c.node;
  const std::size_t chunk = nd.slot_bytes / c.es;
  const int L = across_nodes ? nd.slices : nd.lsize;
  const bool local = nd.lsize > 1;
  // avg divides once: in the last inter-node combine, or here on a single node.
  const int total_div = c.op == ReduceOp::avg ? nd.size : 1;
  std::vector<const char*> srcs(nd.lsize);
  for (std::size_t base = 0; base < count; base += chunk) {
    std::size_t n = std::min(chunk, count - base), off = base * c.es;
    auto sl = ring_chunks(n, L, c.es);
    if (local) {
      // Publish the slices the peers reduce; this rank reads its own from `in`.
      for (int s = 0; s < L; ++s)
        if (nd.owner(s) != nd.lrank && sl[s + 1] > sl[s])
          std::memcpy(nd.slot(nd.lrank, nd.use) + sl[s] * c.es, in + off + sl[s] * c.es, (sl[s + 1] - sl[s]) * c.es);
      nd.publish();
      nd.wait_peers(c.what);
    }
    for (int s = nd.lrank; s < L; s += nd.lsize) {  // this rank's slices, in increasing order
      std::size_t so = sl[s] * c.es, sn = sl[s + 1] - sl[s];
      if (sn == 0) continue;
      for (int j = 0; j < nd.lsize; ++j) srcs[j] = (j == nd.lrank ? in + off : nd.slot(j, nd.use)) + so;
      MPI_Comm group = across_nodes ? nd.slice_comm[s] : MPI_COMM_NULL;
      bool cross = group != MPI_COMM_NULL;
      reduce_sources(c, out + off + so, local && !cross ? nd.slot(nd.lrank, nd.use) + so : nullptr, srcs.data(),
                     nd.lsize, sn, cross ? 1 : total_div);
      if (cross) {
        cross_allreduce(c, group, out + off + so, sn, total_div);
        if (local) std::memcpy(nd.slot(nd.lrank, nd.use) + so, out + off + so, sn * c.es);
      }
    }
    if (local) {
      nd.publish();
      nd.wait_peers(c.what);
      for (int s = 0; s < L; ++s) {
        int o = nd.owner(s);
        if (o == nd.lrank || sl[s + 1] == sl[s]) continue;
        std::memcpy(out + off + sl[s] * c.es, nd.slot(o, nd.use) + sl[s] * c.es, (sl[s + 1] - sl[s]) * c.es);
      }
    }
    ++nd.use;
  }
}

}  // namespace

void shm_allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                   const Communicator& comm, const CollectiveOptions& opt) {
  const char* what = "allreduce";
  RT_CHECK(comm.node_count() == 1, what, ": algorithm shm needs every rank of communicator '", comm.name(),
           "' on one node, but it spans ", comm.node_count(), " nodes (use hierarchical or auto)");
  ShmNode& nd = shm_detail::shm_node(comm, what, opt);
  Call c{nd, what, dtype, op, dtype_size(dtype), {}, opt};
  int divisor = op == ReduceOp::avg ? nd.size : 1;
  auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  if (count * c.es <= nd.small_bytes) one_round(c, in, out, count, divisor);
  else chunked(c, in, out, count, false);
}

void hierarchical_allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                            const Communicator& comm, const CollectiveOptions& opt) {
  const char* what = "allreduce";
  ShmNode& nd = shm_detail::shm_node(comm, what, opt);
  Call c{nd, what, dtype, op, dtype_size(dtype), {}, opt};
  chunked(c, static_cast<const char*>(send), static_cast<char*>(recv), count, comm.node_count() > 1);
}

// In slot-sized chunks: publish the chunk, then reduce the part of it that this
// rank's block covers from every rank's copy, in rank order, with avg's divisor
// on the last combine: each element gets exactly the operands and order of
// shm_allreduce, so the blocks are bitwise the all-reduce's.
void shm_reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype,
                        ReduceOp op, const Communicator& comm, const CollectiveOptions& opt) {
  const char* what = "reduce_scatter";
  RT_CHECK(comm.node_count() == 1, what, ": algorithm shm needs every rank of communicator '", comm.name(),
           "' on one node, but it spans ", comm.node_count(), " nodes");
  RT_CHECK(static_cast<int>(counts.size()) == comm.size(), what, ": counts has ", counts.size(), " entries for ",
           comm.size(), " ranks");
  ShmNode& nd = shm_detail::shm_node(comm, what, opt);
  Call c{nd, what, dtype, op, dtype_size(dtype), {}, opt};
  const int divisor = op == ReduceOp::avg ? nd.size : 1;
  std::size_t lo = 0, total = 0;
  for (int r = 0; r < comm.size(); ++r) {
    if (r < comm.rank()) lo += counts[static_cast<std::size_t>(r)];
    total += counts[static_cast<std::size_t>(r)];
  }
  const std::size_t hi = lo + counts[static_cast<std::size_t>(comm.rank())];
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  const std::size_t chunk = nd.slot_bytes / c.es;
  std::vector<const char*> srcs(nd.lsize);
  for (std::size_t base = 0; base < total; base += chunk) {
    const std::size_t n = std::min(chunk, total - base);
    // The peers read everything but this rank's own block.
    if (lo > base) std::memcpy(nd.slot(nd.lrank, nd.use), in + base * c.es, (std::min(lo, base + n) - base) * c.es);
    if (base + n > hi) {
      const std::size_t a = std::max(hi, base);
      std::memcpy(nd.slot(nd.lrank, nd.use) + (a - base) * c.es, in + a * c.es, (base + n - a) * c.es);
    }
    nd.publish();
    nd.wait_peers(c.what);
    const std::size_t a = std::max(lo, base), b = std::min(hi, base + n);
    if (b > a) {
      for (int j = 0; j < nd.lsize; ++j)
        srcs[j] = j == nd.lrank ? in + a * c.es : nd.slot(j, nd.use) + (a - base) * c.es;
      reduce_sources(c, out + (a - lo) * c.es, nullptr, srcs.data(), nd.lsize, b - a, divisor);
    }
    ++nd.use;
  }
}

std::size_t cross_node_bytes_sent(const Communicator& comm) {
  return shm_detail::shm_node(comm, "cross_node_bytes_sent").cross_bytes;
}

}  // namespace ringtrain
