#pragma once
// The per-communicator state of the node-aware algorithms (see
// include/ringtrain/comm/shm.hpp for the protocol): this rank's node, the mapped
// segments of its node's ranks, the sequence counters, and the inter-node
// communicators of the hierarchical all-reduce.
#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/comm/host_backend.hpp"

namespace ringtrain::shm_detail {

constexpr std::size_t kHeaderBytes = 4096;  // the counter's cache line, padded so slots stay page-aligned

struct ShmNode {
  int lrank = 0, lsize = 1;          // this rank on its node
  int size = 1;                      // the communicator's size
  int slices = 1;                    // slices per chunk: the largest node's rank count
  std::vector<int> comm_rank;        // local index -> rank in the communicator
  std::vector<int> world_rank;       // local index -> rank in MPI_COMM_WORLD (messages)
  std::vector<int> pid;              // local index -> process id (liveness checks)
  std::vector<char*> base;           // local index -> mapped segment
  std::size_t seg_bytes = 0, slot_bytes = 0, small_bytes = 0;
  std::uint64_t step = 0;            // this rank's counter value (published in base[lrank])
  std::uint64_t use = 0;             // chunks so far: the slot parity
  double timeout_s = 300, spin_s = 5e-3;
  std::string comm_name;
  std::vector<MPI_Comm> slice_comm;  // [s]: ranks owning slice s on their node (MPI_COMM_NULL if not us)
  HostWorkspace cross_ws;            // scratch of the inter-node primitives
  std::vector<unsigned char> block;  // the reducer's L1-sized accumulator
  std::size_t cross_bytes = 0;       // bytes sent to other nodes

  ~ShmNode();
  std::atomic<std::uint64_t>& seq(int i) const {
    return *reinterpret_cast<std::atomic<std::uint64_t>*>(base[i]);
  }
  char* slot(int i, std::uint64_t u) const { return base[i] + kHeaderBytes + (u % 2) * slot_bytes; }
  int owner(int slice) const { return slice % lsize; }
  // Publish this rank's next step (its slot writes become visible to the peers).
  void publish() { seq(lrank).store(++step, std::memory_order_release); }
  // Wait until every peer of the node has published `step` (acquire); ends the
  // job with a message naming the rank if one dies or stalls. `what` names the call.
  void wait_peers(const char* what) const;
};

// The state for `comm`, created by its first call (collective over `comm`: every
// rank must be in the same node-aware all-reduce). Errors are raised on every rank.
// Its sizes come from the first call's options (shm_chunk_bytes, shm_small_bytes).
ShmNode& shm_node(const Communicator& comm, const char* what, const CollectiveOptions& opt = {});

}  // namespace ringtrain::shm_detail
