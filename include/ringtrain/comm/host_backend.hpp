#pragma once
// The host backend of the primitives: MPI point-to-point transport, CPU
// reduction kernels, and a reusable host workspace.
// Rules:
//  - MpiTransport sends raw bytes (MPI_BYTE) with one tag per algorithm in a
//    range of tags reserved for ringtrain (kTagBase..), on the Communicator's own
//    duplicated MPI communicator, so it never matches user traffic.
//  - A wait is wait_bounded (comm/bounded_wait.hpp): it keeps the core for a
//    while (5 ms; 20 us when the node has more ranks than cores), then yields
//    between polls; past the communicator's timeout (Communicator::timeout_s)
//    the job is aborted with a message naming the operation, the peer and the
//    communicator: a stalled collective never hangs.
//  - CpuReducer's kernels are the RT_HD math of reduce_math.hpp in vectorisable
//    loops (AVX2/F16C clones chosen at load time); every element goes through the
//    same code on every rank, so results are bitwise reproducible.
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/primitives.hpp"

namespace ringtrain {

// The largest tag every MPI accepts (the standard guarantees MPI_TAG_UB >= 32767;
// larger tags work on some libraries and fail on others). Every tag ringtrain
// sends with is at most this; MpiTransport refuses larger ones.
inline constexpr int kMaxMpiTag = 32767;

// Tags ringtrain's collectives use.
enum CollectiveTag : int {
  kTagBase = 0x5200,
  kTagRing = kTagBase + 1,
  kTagTree = kTagBase + 2,
  kTagBroadcast = kTagBase + 3,
  kTagAllgather = kTagBase + 4,
  kTagReduceScatter = kTagBase + 5,
  kTagAlltoall = kTagBase + 6,  // comm/alltoall.hpp
};
static_assert(kTagAlltoall <= kMaxMpiTag, "collective tags must stay within MPI's guaranteed range");

class MpiTransport final : public Transport {
 public:
  // `what` names the operation and `comm_name` the communicator in the stall message.
  // Both strings must outlive the transport (it lives for one collective call).
  // A wait spins for spin_s seconds before it starts yielding the core.
  MpiTransport(MPI_Comm comm, int tag, const char* what, const char* comm_name, double timeout_s,
               double spin_s);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Request isend(const void* buf, std::size_t bytes, int peer) override;
  Request irecv(void* buf, std::size_t bytes, int peer) override;
  void wait(Request& r) override;
  bool test(Request& r) override;

 private:
  [[noreturn]] void stalled(const Request& r, const StallError& e) const;
  MPI_Comm comm_;
  int tag_, rank_ = 0, size_ = 1;
  const char* what_;
  const char* comm_name_;
  double timeout_s_, spin_s_;
  bool yielding_ = false;  // once one wait has spun out, the rest of the call yields at once
  WaitOn on_;
};

class CpuReducer final : public Reducer {
 public:
  void reduce(void* dst, const void* a, const void* b, std::size_t n, DType dtype, ReduceOp op,
              int divisor) override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void divide(void* buf, std::size_t n, DType dtype, int divisor) override;
};

// Grows, never shrinks; pages are touched once, not per collective.
class HostWorkspace final : public Workspace {
 public:
  void* get(std::size_t bytes) override;

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> buf_;
  std::size_t bytes_ = 0;
};

// What the host collectives keep per MPI communicator (an MPI attribute, freed
// with the communicator): the workspace, the timeout and the spin time, set at
// the communicator's first collective. Collectives on one communicator must
// not run concurrently (MPI's rule too), so one context per communicator suffices.
struct HostCommContext {
  HostWorkspace workspace;
  double spin_s = 5e-3;               // how long a wait keeps the core (see MpiTransport)
};
// `local_size`: ranks of `comm` on this node (Communicator::local_size()).
// Local only (no collective call), so it cannot stall.
HostCommContext& host_context(MPI_Comm comm, int local_size);

}  // namespace ringtrain
