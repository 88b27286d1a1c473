#pragma once
// All-to-all exchanges on host memory: every rank sends a block to every rank
// (the sequence-parallel transpose of Ulysses attention, the token dispatch of
// expert parallelism).
//
// Our algorithm (CollectiveOptions::algorithm anything but `mpi`) is the
// pairwise exchange: at step k = 1..p-1 rank r sends its block for (r+k) mod p
// and receives the block of (r-k) mod p, with kAlltoallWindow steps in flight
// at once; step 0 is the local copy. Every link carries each block once, so a
// rank sends (p-1)/p of its buffer: busbw = bytes (p-1)/p / time. Algorithm
// `mpi` runs MPI_Ialltoallv instead (the reference). Both wait through
// wait_bounded (comm/bounded_wait.hpp): a rank that never enters ends the job
// after the communicator's timeout, named with the peer this rank waited for.
//
// Counts are in elements of `dtype` (DType::u8 for raw bytes); displacements in
// elements from the buffer's start. Every block is sent, zero-length ones too,
// so a rank's receive of the wrong length is noticed: a block longer than the
// receiver expects (MPI truncation) or shorter (the received length is checked)
// raises an Error on the receiving rank, after the exchange has completed (no
// transfer still writes into the caller's buffers), naming both ranks and both
// counts. With CollectiveOptions::validate the ranks first exchange their
// counts and agree on dtype and algorithm, so a mismatch raises an Error on
// every rank before any data moves. send and recv must not overlap.
#include <cstddef>
#include <memory>
#include <vector>

#include "ringtrain/comm/collectives.hpp"

namespace ringtrain {

// Pairwise steps in flight at once: enough to keep the links of a node busy
// while a late peer is waited for, few enough that a rank does not flood one
// receiver with unexpected messages.
inline constexpr int kAlltoallWindow = 4;

// send holds size() * count elements, block j (for rank j) at j * count;
// recv receives rank i's block at i * count.
void alltoall(const void* send, void* recv, std::size_t count, DType dtype, const Communicator& comm,
              const CollectiveOptions& opt = {});

// send_counts[j] elements from send + send_displs[j] go to rank j; rank i's
// block lands at recv + recv_displs[i] and must hold recv_counts[i] elements.
void alltoallv(const void* send, const std::vector<std::size_t>& send_counts,
               const std::vector<std::size_t>& send_displs, void* recv, const std::vector<std::size_t>& recv_counts,
               const std::vector<std::size_t>& recv_displs, DType dtype, const Communicator& comm,
               const CollectiveOptions& opt = {});

// The started form (issue 43's overlap of the token exchange with expert
// compute): alltoallv_start checks its arguments as alltoallv does (validate
// included, which blocks for the agreement), copies this rank's own block, posts
// every receive and send at once (all p-1 steps: no window) and returns; the
// caller computes, may call progress() now and then, and must call wait()
// before it touches recv or send again. wait() waits through wait_bounded
// (comm.collective_timeout_s), receive by receive, so a stall names the peer
// as the blocking form does, and raises a length mismatch the same way.
// Algorithm `mpi` posts MPI_Ialltoallv. One started exchange per communicator
// at a time, and no other all-to-all on it until its wait().
class AlltoallvRequest {
 public:
  AlltoallvRequest();
  AlltoallvRequest(AlltoallvRequest&&) noexcept;
  AlltoallvRequest& operator=(AlltoallvRequest&&) noexcept;
  ~AlltoallvRequest();  // one never waited for is waited for here (bounded); errors are logged
  bool pending() const { return st_ != nullptr; }
  // Lets MPI move the transfers on (one MPI_Iprobe: Open MPI progresses its
  // transports there) without completing anything; cheap enough between GEMMs.
  void progress();
  // Completes the receives only (recv holds every block; send must still stay
  // untouched): a rank need not wait for its peers to take its data before
  // using theirs. Returns the seconds it blocked.
  double wait_received();
  // Completes the exchange; returns the seconds it blocked. Nothing pending: returns 0.
  double wait();
  struct State;

 private:
  friend AlltoallvRequest alltoallv_start(const void*, const std::vector<std::size_t>&,
                                          const std::vector<std::size_t>&, void*, const std::vector<std::size_t>&,
                                          const std::vector<std::size_t>&, DType, const Communicator&,
                                          const CollectiveOptions&);
  std::unique_ptr<State> st_;
};

AlltoallvRequest alltoallv_start(const void* send, const std::vector<std::size_t>& send_counts,
                                 const std::vector<std::size_t>& send_displs, void* recv,
                                 const std::vector<std::size_t>& recv_counts,
                                 const std::vector<std::size_t>& recv_displs, DType dtype, const Communicator& comm,
                                 const CollectiveOptions& opt = {});

// The counts each rank will receive, given what every rank sends: returns
// recv_counts with recv_counts[i] = rank i's send_counts[this rank] (one
// all-to-all of p 64-bit counts; the small collective issue 43 sends before
// its token payload).
std::vector<std::size_t> exchange_counts(const std::vector<std::size_t>& send_counts, const Communicator& comm,
                                         const CollectiveOptions& opt = {});

// Counts first, then the payload, in one call (issue 43's token dispatch):
// send holds the blocks for ranks 0..p-1 packed in rank order, send_counts[j]
// elements for rank j; `recv` is resized to the blocks received, packed in rank
// order. Returns recv_counts (what each rank sent here).
std::vector<std::size_t> alltoallv_exchanging_counts(const void* send, const std::vector<std::size_t>& send_counts,
                                                     std::vector<unsigned char>& recv, DType dtype,
                                                     const Communicator& comm, const CollectiveOptions& opt = {});

// Packed displacements of `counts` (exclusive prefix sum).
std::vector<std::size_t> packed_displs(const std::vector<std::size_t>& counts);

}  // namespace ringtrain
