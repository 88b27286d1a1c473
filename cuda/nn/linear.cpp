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
// Mixed precision (Backend::bf16_activations): a float32 kernel also takes
// bf16 x, w (the layer's bf16 weight copy), y, dy, dx with the float32 bias
// and writes float32 dw and db: cuBLAS multiplies the bf16 operands on tensor
// cores and accumulates in float32 (into float32 C for the gradients), as the
// CPU backend's oneDNN matmul does. y may be float32 beside bf16 inputs (an
// LM head's logits for the loss), as on the CPU. float16 activations
// (Backend::fp16_activations) take the same path with CUDA_R_16F operands.
#include <algorithm>

#include "nn/common.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda::nnimpl {
namespace {

class CublasLinear final : public LinearKernel {
 public:
  CublasLinear(SharedPtr sh, const LinearSpec& s) : sh_(std::move(sh)), s_(s) {
    RT_CHECK(s.in_features > 0 && s.out_features > 0, "linear: features must be positive");
    (void)cublas_type(s.dtype, "linear");  // a dtype cuBLAS takes
  }

  void forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) override {
    const char* what = "linear forward";
    const DType t = act_type(x, s_.dtype, what, "x");
    expect_weight(w, t, what);
    const bool half = t == DType::bf16 || t == DType::f16;
    const DType yt = half && y.defined() && y.dtype() == DType::f32 ? DType::f32 : t;
    expect_cuda(y, yt, what, "y");
    RT_CHECK(x.ndim() == 2 && x.dim(1) == s_.in_features, what, ": x ", shape_str(x.shape()), " is not [N, ",
             s_.in_features, "]");
    int N = static_cast<int>(x.dim(0)), in = static_cast<int>(s_.in_features), out = static_cast<int>(s_.out_features);
    CudaContext& c = sh_->ctx(x);
    gemm(c, t, yt, CUBLAS_OP_T, CUBLAS_OP_N, out, N, in, w.raw(), in, x.raw(), in, false, y.raw(), out);
    if (b.defined()) {  // y[n, o] += b[o], ReLU fused: one pass
      expect_cuda(b, s_.dtype, what, "b");
      bias_add(y.raw(), b.raw(), N, out, 1, s_.fuse_relu, yt, s_.dtype, c.compute());
    } else if (s_.fuse_relu) {
      relu_forward(y.raw(), y.raw(), y.numel(), yt, c.compute());
    }
  }

  void backward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& dy, Tensor& dx, Tensor& dw,
                Tensor& db, bool accumulate) override {
    const char* what = "linear backward";
    const DType t = act_type(x, s_.dtype, what, "x");
    expect_cuda(dy, t, what, "dy");
    int N = static_cast<int>(x.dim(0)), in = static_cast<int>(s_.in_features), out = static_cast<int>(s_.out_features);
    CudaContext& c = sh_->ctx(x);
    const void* g = dy.raw();
    if (s_.fuse_relu) {
      expect_cuda(y, t, what, "y");
      void* m = masked_.get(dy.nbytes(), dy.device());
      relu_backward(m, dy.raw(), y.raw(), dy.numel(), t, c.compute());
      g = m;
    }
    if (dw.defined()) {  // the parameter gradients have the parameters' dtype (float32 masters)
      expect_cuda(dw, s_.dtype, what, "dw");
      gemm(c, t, s_.dtype, CUBLAS_OP_N, CUBLAS_OP_T, in, out, N, x.raw(), in, g, out, accumulate, dw.raw(), in);
    }
    if (db.defined()) {
      expect_cuda(db, s_.dtype, what, "db");
      gemm(c, t, s_.dtype, CUBLAS_OP_N, CUBLAS_OP_N, out, 1, N, g, out, ones(c, N, t), N, accumulate, db.raw(), out);
    }
    if (dx.defined()) {
      expect_weight(w, t, what);
      expect_cuda(dx, t, what, "dx");
      gemm(c, t, t, CUBLAS_OP_N, CUBLAS_OP_N, in, N, out, w.raw(), in, g, out, false, dx.raw(), in);
    }
  }

 private:
  void expect_weight(const Tensor& w, DType t, const char* what) const {
    RT_CHECK(!w.defined() || w.dtype() == t, what, ": the weight is ", dtype_name(w.dtype()), " but the input ",
             dtype_name(t), " (16-bit activations take a weight copy of their type)");
    expect_cuda(w, t, what, "w");
  }

  // C (dtype cd) = A B (+ C when accumulating), A and B of dtype ab.
  void gemm(CudaContext& c, DType ab, DType cd, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
            const void* A, int lda, const void* B, int ldb, bool accumulate, void* C, int ldc) {
    float one = 1.0f, zero = 0.0f;
    double oned = 1.0, zerod = 0.0;
    bool dbl = ab == DType::f64;
    const void* alpha = dbl ? static_cast<const void*>(&oned) : &one;
    const void* beta = accumulate ? alpha : (dbl ? static_cast<const void*>(&zerod) : &zero);
    const cudaDataType_t at = cublas_type(ab, "linear"), ct = cublas_type(cd, "linear");
    RT_CUBLAS(cublasGemmEx(c.cublas(), ta, tb, m, n, k, alpha, A, at, lda, B, at, ldb, beta, C, ct, ldc,
                           compute_type(ab, s_.math), CUBLAS_GEMM_DEFAULT));
  }

  // A vector of N ones of dtype dt (exact in every dtype), rebuilt only when N grows or dt changes.
  const void* ones(CudaContext& c, int N, DType dt) {
    if (N > ones_n_ || dt != ones_dt_) {
      void* p = ones_.get(static_cast<std::size_t>(std::max(N, ones_n_)) * dtype_size(DType::f64), c.device());
      ones_n_ = std::max(N, ones_n_);
      fill(p, static_cast<std::size_t>(ones_n_), dt, 1.0, c.compute());
      ones_dt_ = dt;
    }
    return ones_.get(0, c.device());
  }

  SharedPtr sh_;
  LinearSpec s_;
  Scratch masked_, ones_;
  int ones_n_ = 0;
  DType ones_dt_ = DType::f32;
};

}  // namespace

std::unique_ptr<LinearKernel> make_linear(SharedPtr sh, const LinearSpec& s) {
  return std::make_unique<CublasLinear>(std::move(sh), s);
}

}  // namespace ringtrain::cuda::nnimpl
