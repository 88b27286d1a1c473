#pragma once
// Error checks for CUDA, cuBLAS and cuDNN calls. Rules: every failing call
// becomes a ringtrain::Error naming the call and the library's own message,
// plus a HINT where the usual cause is known; nothing here aborts the process.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "ringtrain/core/error.hpp"

namespace ringtrain::cuda {

[[noreturn]] void raise_cuda(cudaError_t e, const char* what, const char* file, int line);
[[noreturn]] void raise_cublas(cublasStatus_t s, const char* what, const char* file, int line);
[[noreturn]] void raise_cudnn(cudnnStatus_t s, const char* what, const char* file, int line);

}  // namespace ringtrain::cuda

#define RT_CUDA(call)                                                                        \
  do {                                                                                       \
    cudaError_t rt_e_ = (call);                                                              \
    if (rt_e_ != cudaSuccess) ::ringtrain::cuda::raise_cuda(rt_e_, #call, __FILE__, __LINE__); \
  } while (0)
#define RT_CUBLAS(call)                                                                          \
  do {                                                                                           \
    cublasStatus_t rt_s_ = (call);                                                               \
    if (rt_s_ != CUBLAS_STATUS_SUCCESS) ::ringtrain::cuda::raise_cublas(rt_s_, #call, __FILE__, __LINE__); \
  } while (0)
#define RT_CUDNN(call)                                                                         \
  do {                                                                                         \
    cudnnStatus_t rt_s_ = (call);                                                              \
    if (rt_s_ != CUDNN_STATUS_SUCCESS) ::ringtrain::cuda::raise_cudnn(rt_s_, #call, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: reports bad launch configurations at the launch site.
#define RT_CUDA_LAUNCHED(name) RT_CUDA(cudaGetLastError())
