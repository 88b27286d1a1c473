#include "ringtrain/cuda/context.hpp"

#include <cstdlib>
#include <string>

#include "ringtrain/core/log.hpp"
#include "ringtrain/cuda/check.hpp"
#include "ringtrain/cuda/memory.hpp"

namespace ringtrain::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

int select_device(const Communicator& comm) {
  int n = device_count();
  RT_CHECK(n > 0, "rank ", comm.rank(), ": no CUDA device is visible (CUDA_VISIBLE_DEVICES?)",
           "; run with --device cpu");
  int dev = comm.local_rank() % n;
  if (comm.local_size() > n && comm.local_rank() == n)
    log::warn(comm.local_size(), " ranks on this node share ", n, " GPU(s): ranks are oversubscribing devices");
  RT_CUDA(cudaSetDevice(dev));
  return dev;
}

CudaContext::CudaContext(int device, std::size_t workspace_limit) : device_(device), ws_limit_(workspace_limit) {
  int n = device_count();
  RT_CHECK(device >= 0 && device < n, "CudaContext: device ", device, " does not exist (", n, " visible)");
  RT_CUDA(cudaSetDevice(device));
  RT_CUDA(cudaGetDeviceProperties(&props_, device));
  RT_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamDefault));
  // RINGTRAIN_CUDA_STREAMS=1: communication queues behind compute on one
  // stream (no overlap): a check for ordering bugs between the two streams.
  const char* one = std::getenv("RINGTRAIN_CUDA_STREAMS");
  if (one && std::string(one) == "1") comm_ = compute_;
  else RT_CUDA(cudaStreamCreateWithFlags(&comm_, cudaStreamDefault));
  RT_CUDA(cudaEventCreateWithFlags(&order_, cudaEventDisableTiming));
  RT_CUBLAS(cublasCreate(&cublas_));
  RT_CUBLAS(cublasSetStream(cublas_, compute_));
  RT_CUDNN(cudnnCreate(&cudnn_));
  RT_CUDNN(cudnnSetStream(cudnn_, compute_));
}

CudaContext::~CudaContext() {
  // Destructors must not throw: errors at teardown are ignored.
  cudaSetDevice(device_);
  if (compute_) cudaStreamSynchronize(compute_);
  if (comm_ && comm_ != compute_) cudaStreamSynchronize(comm_);
  if (ws_) device_allocator().deallocate(ws_, ws_bytes_, device());
  if (cudnn_) cudnnDestroy(cudnn_);
  if (cublas_) cublasDestroy(cublas_);
  if (order_) cudaEventDestroy(order_);
  if (comm_ && comm_ != compute_) cudaStreamDestroy(comm_);
  if (compute_) cudaStreamDestroy(compute_);
}

void CudaContext::make_current() const { RT_CUDA(cudaSetDevice(device_)); }

void* CudaContext::workspace(std::size_t bytes) {
  RT_CHECK(bytes <= ws_limit_, "workspace request of ", bytes, " bytes exceeds the limit of ", ws_limit_,
           " bytes (CudaContext workspace_limit)");
  if (bytes <= ws_bytes_) return ws_;
  if (ws_) {
    sync_compute();  // the old block may be in use by queued library calls
    device_allocator().deallocate(ws_, ws_bytes_, device());
  }
  ws_ = device_allocator().allocate(bytes, device());
  ws_bytes_ = bytes;
  return ws_;
}

void CudaContext::stream_wait(cudaStream_t to, cudaStream_t from) {
  if (to == from) return;
  // One event serves every caller: record and wait as one step, or a record
  // from another thread in between would order `to` after the wrong point.
  std::lock_guard lk(order_mu_);
  RT_CUDA(cudaEventRecord(order_, from));
  RT_CUDA(cudaStreamWaitEvent(to, order_, 0));
}

void CudaContext::sync_compute() const { RT_CUDA(cudaStreamSynchronize(compute_)); }

}  // namespace ringtrain::cuda
