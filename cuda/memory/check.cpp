#include "ringtrain/cuda/check.hpp"

#include <string>

namespace ringtrain::cuda {

void raise_cuda(cudaError_t e, const char* what, const char* file, int line) {
  std::string hint;
  if (e == cudaErrorMemoryAllocation)
    hint = " (HINT: the GPU is out of memory; lower the batch size or free cached blocks)";
  else if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
    hint = " (HINT: no usable CUDA device/driver; run with --device cpu)";
  else if (e == cudaErrorInvalidDevice)
    hint = " (HINT: device index out of range; check CUDA_VISIBLE_DEVICES)";
  else if (e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure)
    hint = " (HINT: a kernel faulted; the context is now unusable; rerun under compute-sanitizer)";
  (void)cudaGetLastError();  // clear non-sticky errors so later calls report their own
  detail::raise_error(file, line, cat(what, " failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e), hint));
}

void raise_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  detail::raise_error(file, line, cat(what, " failed: ", cublasGetStatusName(s), ": ", cublasGetStatusString(s)));
}

void raise_cudnn(cudnnStatus_t s, const char* what, const char* file, int line) {
  std::string hint;
  if (s == CUDNN_STATUS_NOT_SUPPORTED)
    hint = " (HINT: this shape/dtype/layout combination is not supported by cuDNN)";
  detail::raise_error(file, line, cat(what, " failed: ", cudnnGetErrorString(s), hint));
}

}  // namespace ringtrain::cuda
