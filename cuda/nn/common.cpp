#include "nn/common.hpp"

#include <cstdlib>
#include <cstring>

#include "ringtrain/cuda/memory.hpp"

namespace ringtrain::cuda {

BackendOptions BackendOptions::from_env() {
  BackendOptions o;
  if (const char* v = std::getenv("RINGTRAIN_CUDNN_FIND")) {
    RT_CHECK(!std::strcmp(v, "0") || !std::strcmp(v, "1"), "RINGTRAIN_CUDNN_FIND must be 0 or 1, got '", v, "'");
    o.cudnn_find = v[0] == '1';
  }
  if (const char* v = std::getenv("RINGTRAIN_CUDNN_DETERMINISTIC")) {
    RT_CHECK(!std::strcmp(v, "0") || !std::strcmp(v, "1"), "RINGTRAIN_CUDNN_DETERMINISTIC must be 0 or 1, got '", v,
             "'");
    o.cudnn_deterministic = v[0] == '1';
  }
  return o;
}

namespace nnimpl {

cudnnDataType_t cudnn_type(DType dt, const char* what) {
  switch (dt) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    default: RT_FAIL(what, ": dtype ", dtype_name(dt), " is not supported by cuDNN layers");
  }
}

cudaDataType_t cublas_type(DType dt, const char* what) {
  switch (dt) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f64: return CUDA_R_64F;
    default: RT_FAIL(what, ": dtype ", dtype_name(dt), " is not supported by cuBLAS layers");
  }
}

void TensorDesc::set4(DType dt, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, const char* what) {
  RT_CHECK(n * c * h * w < (std::int64_t{1} << 31), what, ": tensor [", n, ", ", c, ", ", h, ", ", w,
           "] is too large for a cuDNN descriptor");
  RT_CUDNN(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, cudnn_type(dt, what), static_cast<int>(n),
                                      static_cast<int>(c), static_cast<int>(h), static_cast<int>(w)));
}

CudaContext& Shared::ctx(int device) {
  std::lock_guard lk(mu_);
  RT_CHECK(device >= 0 && device < device_count(), "CUDA backend: device cuda:", device, " does not exist");
  if (ctx_.size() <= static_cast<std::size_t>(device)) ctx_.resize(device + 1);
  if (!ctx_[device]) ctx_[device] = std::make_unique<CudaContext>(device);
  return *ctx_[device];
}

void Shared::sync_all() {
  std::lock_guard lk(mu_);
  for (auto& c : ctx_)
    if (c) c->sync_compute();
}

void expect_cuda(const Tensor& t, DType dt, const char* what, const char* arg) {
  RT_CHECK(t.defined(), what, ": ", arg, " is undefined");
  RT_CHECK(t.device().is_cuda(), what, ": ", arg, " is on ", t.device().str(), ", expected a CUDA device");
  RT_CHECK(t.dtype() == dt, what, ": ", arg, " has dtype ", dtype_name(t.dtype()), ", expected ", dtype_name(dt));
}

DType act_type(const Tensor& t, DType dt, const char* what, const char* arg) {
  const bool half = t.defined() && (t.dtype() == DType::bf16 || t.dtype() == DType::f16);
  const DType a = half && dt == DType::f32 ? t.dtype() : dt;
  expect_cuda(t, a, what, arg);
  return a;
}

cublasComputeType_t compute_type(DType in, MathMode math) {
  if (in == DType::f64) return CUBLAS_COMPUTE_64F;
  if (in != DType::f32) return CUBLAS_COMPUTE_32F;  // bf16/f16 operands, float32 accumulation
  switch (math) {
    case MathMode::tf32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case MathMode::bf16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    case MathMode::fp16: return CUBLAS_COMPUTE_32F_FAST_16F;
    default: return CUBLAS_COMPUTE_32F;
  }
}

Scratch::~Scratch() {
  if (p_) device_allocator().deallocate(p_, bytes_, dev_);
}

void* Scratch::get(std::size_t bytes, Device d) {
  if (bytes <= bytes_ && d == dev_) return p_;
  if (p_) {
    cudaDeviceSynchronize();  // warm-up only: the old block may be in use by queued work
    device_allocator().deallocate(p_, bytes_, dev_);
  }
  dev_ = d;
  p_ = device_allocator().allocate(bytes, d);
  bytes_ = bytes;
  return p_;
}

}  // namespace nnimpl
}  // namespace ringtrain::cuda
