#pragma once
// One rank's CUDA state, passed explicitly (no hidden globals): its device, a
// compute stream (forward, backward, optimizer), a comm stream (collectives on
// device buffers overlap compute), cuBLAS and cuDNN handles bound to the
// compute stream, and a workspace for cuDNN/cuBLAS that only grows during
// warm-up (the first step), so a steady-state step allocates nothing.
//
// Rules: call select_device() before any other CUDA work in the process (it
// binds the rank to local_rank % device_count); both streams are *blocking*
// streams so that synchronous legacy-stream copies (Tensor::to) observe their
// work; ordering between the two streams is by events, never device-wide syncs.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <mutex>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/device.hpp"

namespace ringtrain::cuda {

// True when the CUDA backend registered a device allocator (a GPU is present).
bool available();
int device_count();  // 0 without a GPU (never throws)

// cudaSetDevice(comm.local_rank() % device_count()); returns the device index.
// Throws an Error naming the rank if no device is present.
int select_device(const Communicator& comm);

class CudaContext {
 public:
  explicit CudaContext(int device, std::size_t workspace_limit = std::size_t{256} << 20);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device_index() const { return device_; }
  Device device() const { return Device::cuda(device_); }
  cudaStream_t compute() const { return compute_; }
  cudaStream_t comm() const { return comm_; }
  cublasHandle_t cublas() const { return cublas_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  const cudaDeviceProp& props() const { return props_; }

  // Makes this context's device current for the calling thread (the fusion
  // engine's thread calls it before its first collective).
  void make_current() const;

  // Scratch of at least `bytes` (<= workspace_limit) for library calls on the
  // compute stream. Growing frees the old block after syncing the compute
  // stream; it happens only while shapes are first seen (warm-up).
  void* workspace(std::size_t bytes);
  std::size_t workspace_size() const { return ws_bytes_; }
  std::size_t workspace_limit() const { return ws_limit_; }

  // Orders `to` after everything queued so far on `from` (event, no host wait).
  void stream_wait(cudaStream_t to, cudaStream_t from);
  void sync_compute() const;  // host waits for the compute stream (end of step / tests)

 private:
  int device_ = 0;
  cudaDeviceProp props_{};
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cudaEvent_t order_ = nullptr;  // reused by stream_wait, under order_mu_
  std::mutex order_mu_;
  void* ws_ = nullptr;
  std::size_t ws_bytes_ = 0, ws_limit_ = 0;
};

}  // namespace ringtrain::cuda
