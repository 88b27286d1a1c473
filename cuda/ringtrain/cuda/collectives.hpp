#pragma once
// Collectives on device buffers. The ring/tree step logic is the host path's
// (comm/algorithms.hpp over comm/primitives.hpp); this backend supplies only:
//  - KernelReducer: reductions as kernels on the comm stream (reduce_math's
//    RT_HD rounding, so results equal the host path's bit for bit); flush()
//    syncs that stream before the transport sends results.
//  - a Transport: with CUDA-aware MPI (MPIX_Query_cuda_support at run time,
//    override RINGTRAIN_CUDA_AWARE=0/1) the host MpiTransport on device
//    pointers (CudaAwareTransport); otherwise StagedTransport, which stages each primitive segment
//    (Config::segment_bytes) through its own pinned slot: D2H copy -> MPI_Isend,
//    and MPI_Irecv -> H2D copy enqueued on the comm stream ahead of the
//    reduction kernel. The primitives keep `window` segments in flight, so the
//    D2H copy, the MPI transfer, the GPU reduction and the H2D copy of
//    different segments overlap: no stage waits for the whole message.
//  - a device Workspace for the primitives' receive slots (grows, never shrinks).
// Rules: one DeviceCollectives per (rank, device, communicator use); calls on
// it must not run concurrently; buffers are device pointers on ctx's device
// whose contents are complete when the call starts (the caller orders or syncs
// its producers, e.g. FusionOps::synchronize);
// on return the results are complete on the comm stream (host-visible after
// a stream sync; compute-stream users order after it with an event).
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/primitives.hpp"
#include "ringtrain/cuda/context.hpp"
#include "ringtrain/cuda/memory.hpp"

namespace ringtrain::cuda {

class KernelReducer final : public Reducer {
 public:
  explicit KernelReducer(cudaStream_t s) : s_(s) {}
  void reduce(void* dst, const void* a, const void* b, std::size_t n, DType dtype, ReduceOp op,
              int divisor) override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void divide(void* buf, std::size_t n, DType dtype, int divisor) override;
  void flush() override;

 private:
  cudaStream_t s_;
};

class DeviceWorkspace final : public Workspace {
 public:
  explicit DeviceWorkspace(int device) : device_(device) {}
  ~DeviceWorkspace() override;
  void* get(std::size_t bytes) override;
  void* blocks(std::size_t bytes) override;  // device memory: the reduce-scatter's partial sums

 private:
  int device_;
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
  void* blocks_ = nullptr;
  std::size_t blocks_bytes_ = 0;
};

// Pinned staging slots, reused once their last H2D copy has completed.
class StagingPool {
 public:
  ~StagingPool();
  int acquire(std::size_t bytes);  // index of a free slot of at least `bytes`
  void* data(int slot) const { return slots_[slot].buf.data(); }
  // Free after `stream` passes this point (recv: its H2D copy), or at once.
  void release_after(int slot, cudaStream_t stream);
  void release(int slot) { slots_[slot].busy = false; }
  std::size_t slots() const { return slots_.size(); }

 private:
  struct Slot {
    PinnedBuffer buf;
    cudaEvent_t done = nullptr;
    bool busy = false, pending = false;
  };
  std::vector<Slot> slots_;
};

class StagedTransport final : public Transport {
 public:
  // `inner` moves the host bytes (an MpiTransport on the same communicator).
  StagedTransport(Transport& inner, StagingPool& pool, cudaStream_t s) : inner_(inner), pool_(pool), s_(s) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Request isend(const void* buf, std::size_t bytes, int peer) override;
  Request irecv(void* buf, std::size_t bytes, int peer) override;
  void wait(Request& r) override;
  bool test(Request& r) override;

 private:
  struct Op {
    Request inner;
    int slot = -1;
    void* dev = nullptr;  // receive destination on the device
    std::size_t bytes = 0;
    bool in_use = false;
  };
  std::uint64_t new_op();
  void complete(Request& r);

  Transport& inner_;
  StagingPool& pool_;
  cudaStream_t s_;
  std::vector<Op> ops_;
  std::vector<std::uint64_t> free_ops_;
  cudaEvent_t copied_ = nullptr;
};

// CUDA-aware MPI on device pointers. A receive may land in a slot that a
// reduction kernel queued on the stream has not read yet (the primitives
// re-post a slot right after queuing its reduction), so irecv first waits for
// the stream; sends follow Reducer::flush() already.
class CudaAwareTransport final : public Transport {
 public:
  CudaAwareTransport(Transport& inner, cudaStream_t s) : inner_(inner), s_(s) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Request isend(const void* buf, std::size_t bytes, int peer) override { return inner_.isend(buf, bytes, peer); }
  Request irecv(void* buf, std::size_t bytes, int peer) override;
  void wait(Request& r) override { inner_.wait(r); }
  bool test(Request& r) override { return inner_.test(r); }

 private:
  Transport& inner_;
  cudaStream_t s_;
};

class DeviceCollectives {
 public:
  explicit DeviceCollectives(CudaContext& ctx);
  ~DeviceCollectives();
  DeviceCollectives(const DeviceCollectives&) = delete;
  DeviceCollectives& operator=(const DeviceCollectives&) = delete;

  // Same contract as ringtrain::allreduce with opt.device = ctx's device.
  // Algorithm::mpi = MPI_Allreduce: on device pointers when MPI is CUDA-aware,
  // else staged whole through pinned memory (the baseline the ring beats).
  void allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                 const Communicator& comm, const CollectiveOptions& opt = {});
  void broadcast(void* buf, std::size_t count, DType dtype, int root, const Communicator& comm,
                 const CollectiveOptions& opt = {});
  // Same contracts as ringtrain::allgatherv / reduce_scatter; always the ring.
  void allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype,
                  const Communicator& comm, const CollectiveOptions& opt = {});
  void reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype, ReduceOp op,
                      const Communicator& comm, const CollectiveOptions& opt = {});

  bool cuda_aware() const { return cuda_aware_; }
  std::size_t staging_slots() const { return pool_.slots(); }

 private:
  void enter();
  void check_device(const CollectiveOptions& opt, const char* what) const;
  template <typename F>
  void run(const Communicator& comm, int tag, const char* what, DType dtype, ReduceOp op,
           const CollectiveOptions& opt, F&& algo);
  void mpi_allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                     const Communicator& comm);
  CudaContext& ctx_;
  bool cuda_aware_;
  KernelReducer reducer_;
  DeviceWorkspace ws_;
  StagingPool pool_;
  PinnedBuffer whole_;  // Algorithm::mpi's staging when MPI is not CUDA-aware
};

}  // namespace ringtrain::cuda
