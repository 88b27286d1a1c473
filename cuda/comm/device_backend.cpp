// KernelReducer, DeviceWorkspace, StagingPool and StagedTransport: the device
// side of the collective primitives (see ringtrain/cuda/collectives.hpp).
#include <cstdlib>
#include <cstring>

#include "ringtrain/cuda/check.hpp"
#include "ringtrain/cuda/collectives.hpp"
#include "ringtrain/cuda/kernels.hpp"
#include "ringtrain/cuda/mpi_support.hpp"

namespace ringtrain::cuda {

bool use_device_pointers_in_mpi() {
  if (const char* v = std::getenv("RINGTRAIN_CUDA_AWARE")) {
    RT_CHECK(!std::strcmp(v, "0") || !std::strcmp(v, "1"), "RINGTRAIN_CUDA_AWARE must be 0 or 1, got '", v, "'");
    return v[0] == '1';
  }
  return mpi_cuda_aware();
}

// ---- reducer ------------------------------------------------------------------

void KernelReducer::reduce(void* dst, const void* a, const void* b, std::size_t n, DType dtype, ReduceOp op,
                           int divisor) {
  cuda::reduce(dst, a, b, n, dtype, op, divisor, s_);
}
void KernelReducer::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes && dst != src) RT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s_));
}
void KernelReducer::divide(void* buf, std::size_t n, DType dtype, int divisor) {
  cuda::divide(buf, n, dtype, divisor, s_);
}
void KernelReducer::flush() { RT_CUDA(cudaStreamSynchronize(s_)); }

// ---- workspace ----------------------------------------------------------------

DeviceWorkspace::~DeviceWorkspace() {
  if (p_) device_allocator().deallocate(p_, bytes_, Device::cuda(device_));
  if (blocks_) device_allocator().deallocate(blocks_, blocks_bytes_, Device::cuda(device_));
}

void* DeviceWorkspace::get(std::size_t bytes) {
  if (bytes <= bytes_) return p_;
  // Callers finished with the old block (a collective completed before the next starts).
  if (p_) device_allocator().deallocate(p_, bytes_, Device::cuda(device_));
  p_ = device_allocator().allocate(bytes, Device::cuda(device_));
  bytes_ = bytes;
  return p_;
}

void* DeviceWorkspace::blocks(std::size_t bytes) {
  if (bytes <= blocks_bytes_) return blocks_;
  if (blocks_) device_allocator().deallocate(blocks_, blocks_bytes_, Device::cuda(device_));
  blocks_ = device_allocator().allocate(bytes, Device::cuda(device_));
  blocks_bytes_ = bytes;
  return blocks_;
}

// ---- pinned staging slots ----------------------------------------------------------

StagingPool::~StagingPool() {
  for (auto& s : slots_)
    if (s.done) {
      cudaEventSynchronize(s.done);
      cudaEventDestroy(s.done);
    }
}

int StagingPool::acquire(std::size_t bytes) {
  int fit = -1;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.busy) continue;
    if (s.pending) {
      cudaError_t e = cudaEventQuery(s.done);
      if (e == cudaErrorNotReady) continue;
      RT_CUDA(e);
      s.pending = false;
    }
    if (s.buf.bytes() >= bytes) {
      fit = static_cast<int>(i);
      break;
    }
  }
  if (fit < 0) {  // warm-up: a new slot (segments are all the same size afterwards)
    slots_.emplace_back();
    Slot& s = slots_.back();
    s.buf.reserve(bytes < 4096 ? 4096 : bytes);
    RT_CUDA(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    fit = static_cast<int>(slots_.size() - 1);
  }
  slots_[fit].busy = true;
  return fit;
}

void StagingPool::release_after(int slot, cudaStream_t stream) {
  Slot& s = slots_[slot];
  RT_CUDA(cudaEventRecord(s.done, stream));
  s.pending = true;
  s.busy = false;
}

// ---- CUDA-aware transport ----------------------------------------------------------

Request CudaAwareTransport::irecv(void* buf, std::size_t bytes, int peer) {
  RT_CUDA(cudaStreamSynchronize(s_));
  return inner_.irecv(buf, bytes, peer);
}

// ---- staged transport ---------------------------------------------------------------

std::uint64_t StagedTransport::new_op() {
  if (!free_ops_.empty()) {
    auto i = free_ops_.back();
    free_ops_.pop_back();
    return i;
  }
  ops_.emplace_back();
  return ops_.size() - 1;
}

Request StagedTransport::isend(const void* buf, std::size_t bytes, int peer) {
  std::uint64_t id = new_op();
  Op& op = ops_[id];
  op.slot = pool_.acquire(bytes);
  op.bytes = bytes;
  op.dev = nullptr;
  op.in_use = true;
  if (bytes) {
    // The send must be posted now (a deferred post could deadlock a ring whose
    // ranks all wait on receives first), so the host waits for this segment's
    // D2H copy only — earlier segments are already on the wire.
    RT_CUDA(cudaMemcpyAsync(pool_.data(op.slot), buf, bytes, cudaMemcpyDeviceToHost, s_));
    if (!copied_) RT_CUDA(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    RT_CUDA(cudaEventRecord(copied_, s_));
    RT_CUDA(cudaEventSynchronize(copied_));
  }
  op.inner = inner_.isend(pool_.data(op.slot), bytes, peer);
  return Request{id, peer, true, true};
}

Request StagedTransport::irecv(void* buf, std::size_t bytes, int peer) {
  std::uint64_t id = new_op();
  Op& op = ops_[id];
  op.slot = pool_.acquire(bytes);
  op.bytes = bytes;
  op.dev = buf;
  op.in_use = true;
  op.inner = inner_.irecv(pool_.data(op.slot), bytes, peer);
  return Request{id, peer, false, true};
}

// The MPI part is done: a receive's bytes are copied to the device on the comm
// stream (ordered before the reduction that reads them); the slot is reusable
// once that copy has run. A send's slot is free at once.
void StagedTransport::complete(Request& r) {
  Op& op = ops_[r.handle];
  if (!r.is_send && op.bytes) {
    RT_CUDA(cudaMemcpyAsync(op.dev, pool_.data(op.slot), op.bytes, cudaMemcpyHostToDevice, s_));
    pool_.release_after(op.slot, s_);
  } else {
    pool_.release(op.slot);
  }
  op.in_use = false;
  free_ops_.push_back(r.handle);
  r.active = false;
}

void StagedTransport::wait(Request& r) {
  if (!r.active) return;
  inner_.wait(ops_[r.handle].inner);
  complete(r);
}

bool StagedTransport::test(Request& r) {
  if (!r.active) return true;
  if (!inner_.test(ops_[r.handle].inner)) return false;
  complete(r);
  return true;
}

}  // namespace ringtrain::cuda
