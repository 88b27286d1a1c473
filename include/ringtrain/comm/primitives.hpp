#pragma once
// Point-to-point primitives that every collective algorithm is written over
// (NCCL style: send, recv, recvReduceCopy(Send), recvCopySend).
// The algorithm (ring, tree, chain) lives in comm/algorithms.hpp; what moves the
// bytes (Transport) and what combines them (Reducer) are supplied by a backend:
//   host:   MpiTransport (MPI_Isend/Irecv) + CpuReducer (comm/host_backend.hpp)
//   device: a device Transport (pinned staging or CUDA-aware MPI, or later a
//           node-local shared-memory ring) + a kernel Reducer.
// Rules the primitives keep:
//  - Every message is cut into segments of Config::segment_bytes (rounded to whole
//    elements). Both sides cut a chunk identically, so sender and receiver agree on
//    every message without headers; all ranks must use the same Config.
//  - Receives are posted `window` segments ahead into scratch slots, so the next
//    segment is arriving while the current one is reduced and forwarded.
//  - Sends are non-blocking. Before any write into a range (a posted receive or a
//    reduction's output) the sends still reading that range are completed, so
//    in-place algorithms are safe by construction. finish() completes all sends:
//    call it before the user's buffers are handed back.
//  - Between Reducer and Transport: results are reduced, then Reducer::flush(),
//    then the Transport sends them (a device Reducer syncs its stream there).
//  - Messages between a pair of ranks are matched in posting order (one tag per
//    algorithm), so every rank must issue the same sequence of primitives.
#include <cstddef>
#include <array>
#include <memory>
#include <cstdint>
#include <vector>

#include "ringtrain/comm/reduce_math.hpp"
#include "ringtrain/core/dtype.hpp"

namespace ringtrain {

// A posted transfer. `handle` is the transport's own (an MPI_Request for MPI).
struct Request {
  std::uint64_t handle = 0;
  int peer = -1;
  bool is_send = false;
  bool active = false;
};

// Moves bytes between ranks of one group. Buffers live in the memory space the
// transport serves (host memory for MpiTransport).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Post a non-blocking send/receive of `bytes` bytes to/from `peer` (0 bytes is allowed).
  virtual Request isend(const void* buf, std::size_t bytes, int peer) = 0;
  virtual Request irecv(void* buf, std::size_t bytes, int peer) = 0;
  // Complete `r` (no-op when inactive). A transport that cannot complete it in
  // bounded time must end the job with a message (see MpiTransport's deadline).
  virtual void wait(Request& r) = 0;
  // Complete `r` if it has finished; returns whether it has.
  virtual bool test(Request& r) = 0;
};

// Combines element buffers in the reducer's memory space.
class Reducer {
 public:
  virtual ~Reducer() = default;
  // dst[i] = op(a[i], b[i]) for i < n (avg combines as sum), divided by `divisor`
  // before the one rounding when divisor > 1. dst may equal a or b exactly.
  virtual void reduce(void* dst, const void* a, const void* b, std::size_t n, DType dtype, ReduceOp op,
                      int divisor) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  // dst[i] /= divisor (avg when nothing else touches the data, e.g. one rank).
  virtual void divide(void* buf, std::size_t n, DType dtype, int divisor) = 0;
  // Make finished reduce/copy results visible to the Transport.
  virtual void flush() {}
};

// Scratch memory in the reducer's memory space, kept between collectives so that
// its pages are touched once (host: per communicator, see host_backend.hpp).
class Workspace {
 public:
  virtual ~Workspace() = default;
  // At least `bytes` bytes, 64-byte aligned; valid until the next get().
  virtual void* get(std::size_t bytes) = 0;
  // A second region, for the partial sums a reduce-scatter keeps between
  // steps (Primitives::reserve_blocks); valid until the next blocks(). In the
  // reducer's memory space: host memory here, device memory for a device.
  virtual void* blocks(std::size_t bytes) {
    if (bytes > host_blocks_bytes_) {
      host_blocks_.reset(new char[bytes]);
      host_blocks_bytes_ = bytes;
    }
    return host_blocks_.get();
  }

 private:
  std::unique_ptr<char[]> host_blocks_;
  std::size_t host_blocks_bytes_ = 0;
};

// Bytes this process has sent through Primitives (the ring, tree and chain
// algorithms, every transport) since it started; thread-safe. The wire volume
// of a step (bench/parallel_memory.cpp); mpi and shm transfers are not counted.
std::uint64_t primitives_bytes_sent();

class Primitives {
 public:
  struct Config {
    DType dtype = DType::f32;
    ReduceOp op = ReduceOp::sum;
    std::size_t segment_bytes = 512 * 1024;
    int window = 4;  // receive slots in flight per primitive (at most kMaxAhead)
  };
  static constexpr int kMaxAhead = 16;  // receives posted ahead straight into a destination

  // Takes workspace.get(scratch_bytes(cfg)) once; the workspace must not be reused
  // by anyone else until this object is gone.
  Primitives(Transport& t, Reducer& r, Workspace& ws, const Config& cfg);
  ~Primitives();  // completes outstanding sends (finish())
  Primitives(const Primitives&) = delete;
  Primitives& operator=(const Primitives&) = delete;

  static std::size_t scratch_bytes(const Config& cfg);
  int rank() const { return rank_; }
  int size() const { return size_; }
  const Config& config() const { return cfg_; }
  std::size_t elem_size() const { return esize_; }

  // All counts are in elements of cfg.dtype; pointers are element data. n == 0 is a no-op.
  void send(int to, const void* src, std::size_t n);
  void recv(int from, void* dst, std::size_t n);
  // Two blocks of up to n elements each, owned by this object and freed only after its sends
  // complete: the reduce-scatter's middle steps reduce into them, alternately, and forward.
  // (Reusing the segment slots instead made a rank wait, within a step, until its successor
  // had reached the next step; at 3+ ranks every rank did, a cycle, once a block exceeded the
  // window and the transport's eager limit.) Call before the first block().
  void reserve_blocks(std::size_t n);
  char* block(int i) const { return blocks_ + (i % 2) * block_bytes_; }
  // dst = op(incoming, local) [/ divisor].
  void recv_reduce_copy(int from, const void* local, void* dst, std::size_t n, int divisor = 1);
  // dst = op(incoming, local) [/ divisor], and forward dst to `to`.
  void recv_reduce_copy_send(int from, int to, const void* local, void* dst, std::size_t n,
                             int divisor = 1);
  // Receive into dst and forward each segment as soon as it lands.
  void recv_copy_send(int from, int to, void* dst, std::size_t n);
  // Swap with `peer` and combine: dst = op(left, right) [/ divisor], where left is
  // the lower rank's data, so both partners compute bit-identical results.
  void exchange_reduce(int peer, const void* local, void* dst, std::size_t n, int divisor = 1);
  // dst = src (local copy through the Reducer).
  void copy(void* dst, const void* src, std::size_t n);
  // Complete every outstanding send.
  void finish();

 private:
  struct Pending {
    Request req;
    const char* lo;
    const char* hi;
  };
  std::size_t seg_elems() const { return seg_elems_; }
  std::size_t num_segs(std::size_t n) const { return (n + seg_elems_ - 1) / seg_elems_; }
  std::size_t seg_len(std::size_t n, std::size_t k) const;
  char* in_slot(std::size_t k) const { return scratch_ + (k % cfg_.window) * slot_bytes_; }
  // Completes pending sends that read [p, p + bytes).
  void guard_write(const void* p, std::size_t bytes);
  void post_send(int to, const void* p, std::size_t bytes);
  template <typename F>
  void recv_direct(int from, char* d, std::size_t n, F&& landed);
  // Shared loop of the recv-reduce-* primitives.
  void recv_reduce(int from, int to, const void* local, void* dst, std::size_t n, int divisor);
  std::size_t post_recv_window(int from, std::size_t n);

  Transport& t_;
  Reducer& r_;
  Config cfg_;
  int rank_, size_;
  std::size_t esize_, seg_elems_, slot_bytes_;
  char* scratch_;
  Workspace& ws_;
  char* blocks_ = nullptr;  // ws_.blocks(): two of block_bytes_
  std::size_t block_bytes_ = 0;
  std::vector<Pending> pending_;  // sends still reading the blocks or a caller's buffer
  std::array<Request, kMaxAhead> recvs_;
};

}  // namespace ringtrain
