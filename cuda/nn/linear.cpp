// Linear on cuBLAS (GemmEx). Row-major x[N,in], w[out,in], y[N,out] are
// column-major x'[in,N], w'[in,out], y'[out,N], so
//   y' = w'^T x'          gemm(T, N, out, N, in)
//   dx' = w' dy'          gemm(N, N, in, N, out)
//   dw' = x' dy'^T        gemm(N, T, in, out, N)   (beta = accumulate)
//   db = dy' 1_N          gemm(N, N, out, 1, N)    (beta = accumulate)
//   bias (+ReLU): our bias_add kernel, one pass
// f16/bf16 use tensor cores with fp32 accumulation; f32 is strict fp32 unless
// the spec's MathMode (train.precision) allows down-conversion: cuBLAS
// COMPUTE_32F_FAST_TF32 / _FAST_16BF / _FAST_16F on the float32 operands.
#include "nn/common.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda::nnimpl {
namespace {

class CublasLinear final : public LinearKernel {
 public:
  CublasLinear(SharedPtr sh, const LinearSpec& s) : sh_(std::move(sh)), s_(s) {
    RT_CHECK(s.in_features > 0 && s.out_features > 0, "linear: features must be positive");
    type_ = cublas_type(s.dtype, "linear");
    compute_ = CUBLAS_COMPUTE_32F;
    if (s.dtype == DType::f64) compute_ = CUBLAS_COMPUTE_64F;
    else if (s.dtype == DType::f32 && s.math == MathMode::bf16) compute_ = CUBLAS_COMPUTE_32F_FAST_16BF;
    else if (s.dtype == DType::f32 && s.math == MathMode::fp16) compute_ = CUBLAS_COMPUTE_32F_FAST_16F;
    else if (s.dtype == DType::f32 && s.math == MathMode::tf32)
      compute_ = CUBLAS_COMPUTE_32F_FAST_TF32;
  }

  void forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) override {
    const char* what = "linear forward";
    expect_cuda(x, s_.dtype, what, "x");
    expect_cuda(w, s_.dtype, what, "w");
    expect_cuda(y, s_.dtype, what, "y");
    RT_CHECK(x.ndim() == 2 && x.dim(1) == s_.in_features, what, ": x ", shape_str(x.shape()), " is not [N, ",
             s_.in_features, "]");
    int N = static_cast<int>(x.dim(0)), in = static_cast<int>(s_.in_features), out = static_cast<int>(s_.out_features);
    CudaContext& c = sh_->ctx(x);
    gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, out, N, in, w.raw(), in, x.raw(), in, false, y.raw(), out);
    if (b.defined()) {  // y[n, o] += b[o], ReLU fused: one pass
      expect_cuda(b, s_.dtype, what, "b");
      bias_add(y.raw(), b.raw(), N, out, 1, s_.fuse_relu, s_.dtype, c.compute());
    } else if (s_.fuse_relu) {
      relu_forward(y.raw(), y.raw(), y.numel(), s_.dtype, c.compute());
    }
  }

  void backward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& dy, Tensor& dx, Tensor& dw,
                Tensor& db, bool accumulate) override {
    const char* what = "linear backward";
    expect_cuda(dy, s_.dtype, what, "dy");
    int N = static_cast<int>(x.dim(0)), in = static_cast<int>(s_.in_features), out = static_cast<int>(s_.out_features);
    CudaContext& c = sh_->ctx(x);
    const void* g = dy.raw();
    if (s_.fuse_relu) {
      expect_cuda(y, s_.dtype, what, "y");
      void* m = masked_.get(dy.nbytes(), dy.device());
      relu_backward(m, dy.raw(), y.raw(), dy.numel(), s_.dtype, c.compute());
      g = m;
    }
    if (dw.defined()) {
      expect_cuda(dw, s_.dtype, what, "dw");
      gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, in, out, N, x.raw(), in, g, out, accumulate, dw.raw(), in);
    }
    if (db.defined()) {
      expect_cuda(db, s_.dtype, what, "db");
      gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, out, 1, N, g, out, ones(c, N), N, accumulate, db.raw(), out);
    }
    if (dx.defined()) {
      expect_cuda(dx, s_.dtype, what, "dx");
      gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, in, N, out, w.raw(), in, g, out, false, dx.raw(), in);
    }
  }

 private:
  void gemm(CudaContext& c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A, int lda,
            const void* B, int ldb, bool accumulate, void* C, int ldc) {
    float one = 1.0f, zero = 0.0f;
    double oned = 1.0, zerod = 0.0;
    bool dbl = s_.dtype == DType::f64;
    const void* alpha = dbl ? static_cast<const void*>(&oned) : &one;
    const void* beta = accumulate ? alpha : (dbl ? static_cast<const void*>(&zerod) : &zero);
    RT_CUBLAS(cublasGemmEx(c.cublas(), ta, tb, m, n, k, alpha, A, type_, lda, B, type_, ldb, beta, C, type_, ldc,
                           compute_, CUBLAS_GEMM_DEFAULT));
  }

  // A vector of N ones in the layer's dtype, rebuilt only when N grows.
  const void* ones(CudaContext& c, int N) {
    if (N > ones_n_) {
      void* p = ones_.get(static_cast<std::size_t>(N) * dtype_size(s_.dtype), c.device());
      fill(p, static_cast<std::size_t>(N), s_.dtype, 1.0, c.compute());
      ones_n_ = N;
    }
    return ones_.get(0, c.device());
  }

  SharedPtr sh_;
  LinearSpec s_;
  cudaDataType_t type_;
  cublasComputeType_t compute_;
  Scratch masked_, ones_;
  int ones_n_ = 0;
};

}  // namespace

std::unique_ptr<LinearKernel> make_linear(SharedPtr sh, const LinearSpec& s) {
  return std::make_unique<CublasLinear>(std::move(sh), s);
}

}  // namespace ringtrain::cuda::nnimpl
