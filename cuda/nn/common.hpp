#pragma once
// Internal to the CUDA backend: descriptor RAII, dtype mapping, the shared
// per-device contexts and argument checks. Not a public header.
#include <cudnn.h>

#include <array>
#include <mutex>
#include <vector>

#include "ringtrain/cuda/backend.hpp"
#include "ringtrain/cuda/check.hpp"

namespace ringtrain::cuda::nnimpl {

cudnnDataType_t cudnn_type(DType dt, const char* what);
cudaDataType_t cublas_type(DType dt, const char* what);

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { RT_CUDNN(cudnnCreateTensorDescriptor(&d)); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  void set4(DType dt, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, const char* what);
};

// Shared state of the registered backend: options and one context per device.
class Shared {
 public:
  explicit Shared(const BackendOptions& o) : opt(o) {}
  CudaContext& ctx(int device);
  CudaContext& ctx(const Tensor& t) { return ctx(t.device().index); }
  void sync_all();  // host waits for every context's compute stream
  BackendOptions opt;

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<CudaContext>> ctx_;
};
using SharedPtr = std::shared_ptr<Shared>;

// Checks that `t` is a defined CUDA tensor of dtype `dt` (names `what` and `arg`).
void expect_cuda(const Tensor& t, DType dt, const char* what, const char* arg);
// The activation dtype of a kernel created for `dt` given tensor `t`: `dt`, or
// t's bfloat16/float16 when `dt` is float32 (Backend::bf16_activations,
// fp16_activations: layers create float32 kernels and pass 16-bit
// activations); checks `t` as expect_cuda does.
DType act_type(const Tensor& t, DType dt, const char* what, const char* arg);
// cuBLAS's compute type for inputs of dtype `in` under a layer's MathMode: f64
// in double; f32 strict, or with the TF32/bf16/fp16 down-conversion the mode
// allows; 16-bit inputs on tensor cores with float32 accumulation.
cublasComputeType_t compute_type(DType in, MathMode math);
inline std::array<std::int64_t, 4> shape4(const Tensor& t) {
  return {t.dim(0), t.dim(1), t.dim(2), t.dim(3)};
}

// Cached device scratch owned by a kernel (grows only; once per shape).
class Scratch {
 public:
  explicit Scratch(Device d = Device::cuda(0)) : dev_(d) {}
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get(std::size_t bytes, Device d);

 private:
  Device dev_;
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

std::unique_ptr<Conv2dKernel> make_conv2d(SharedPtr sh, const Conv2dSpec& s);
std::unique_ptr<LinearKernel> make_linear(SharedPtr sh, const LinearSpec& s);
std::unique_ptr<BatchNormKernel> make_batchnorm(SharedPtr sh, const BatchNormSpec& s);
std::unique_ptr<Pool2dKernel> make_pool2d(SharedPtr sh, const Pool2dSpec& s);
std::unique_ptr<LayerNormKernel> make_layernorm(SharedPtr sh, const LayerNormSpec& s);
std::unique_ptr<AttentionKernel> make_attention(SharedPtr sh, const AttentionSpec& s);
// The tiled (FlashAttention-2) kernel, attention_tiled.cpp: causal attention, no [T, T] matrix kept.
std::unique_ptr<AttentionKernel> make_tiled_attention(SharedPtr sh, const AttentionSpec& s);

}  // namespace ringtrain::cuda::nnimpl
