// Transformer kernels on CUDA: LayerNorm (our kernels) and the attention core
// on cuBLAS strided-batched GEMM. Per head h, the N samples' Q, K, V are
// strided views of the qkv activation (row stride 3*H*hd, sample stride
// T*3*H*hd), so one GemmStridedBatchedEx call per head and product covers the
// batch; the probabilities [N, H, T, T] stay for the backward.
#include <cmath>

#include "nn/common.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda::nnimpl {
namespace {

class CudaLayerNorm final : public LayerNormKernel {
 public:
  CudaLayerNorm(SharedPtr sh, const LayerNormSpec& s) : sh_(std::move(sh)), s_(s) {
    RT_CHECK(s.features > 0, "cuda LayerNorm: features must be positive");
  }

  void forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y) override {
    const char* what = "layernorm forward";
    expect_cuda(x, s_.dtype, what, "x");
    expect_cuda(y, s_.dtype, what, "y");
    expect_cuda(gamma, s_.dtype, what, "gamma");
    expect_cuda(beta, s_.dtype, what, "beta");
    const std::int64_t d = s_.features, rows = x.numel() / d;
    RT_CHECK(rows * d == x.numel() && y.numel() == x.numel(), what, ": x ", shape_str(x.shape()),
             " is not [rows, ", d, "] or y differs");
    CudaContext& c = sh_->ctx(x);
    auto* st = static_cast<float*>(stats_.get(static_cast<std::size_t>(2 * rows) * sizeof(float), x.device()));
    rows_ = rows;
    layernorm_forward(x.raw(), gamma.raw(), beta.raw(), y.raw(), st, st + rows, rows, d, float(s_.eps), s_.dtype,
                      c.compute());
  }

  void backward(const Tensor& x, const Tensor& gamma, const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                bool accumulate) override {
    const char* what = "layernorm backward";
    expect_cuda(dy, s_.dtype, what, "dy");
    expect_cuda(dgamma, s_.dtype, what, "dgamma");
    expect_cuda(dbeta, s_.dtype, what, "dbeta");
    const std::int64_t d = s_.features, rows = x.numel() / d;
    RT_CHECK(rows == rows_, what, ": no forward of this shape");
    if (dx.defined()) expect_cuda(dx, s_.dtype, what, "dx");
    CudaContext& c = sh_->ctx(x);
    auto* st = static_cast<float*>(stats_.get(0, x.device()));
    void* scratch = work_.get(layernorm_scratch_bytes(rows, d), x.device());
    layernorm_backward(x.raw(), gamma.raw(), dy.raw(), st, st + rows, dx.defined() ? dx.raw() : nullptr,
                       dgamma.raw(), dbeta.raw(), rows, d, accumulate, s_.dtype, scratch, c.compute());
  }

 private:
  SharedPtr sh_;
  LayerNormSpec s_;
  Scratch stats_, work_;
  std::int64_t rows_ = -1;
};

class CublasAttention final : public AttentionKernel {
 public:
  CublasAttention(SharedPtr sh, const AttentionSpec& s) : sh_(std::move(sh)), s_(s) {
    RT_CHECK(s.heads > 0 && s.head_dim > 0, "cuda attention: heads and head_dim must be positive");
    RT_CHECK(!s.causal, "cuda attention: causal masking is not implemented on the GPU yet (train.device = cpu)");
    type_ = cublas_type(s.dtype, "attention");
    compute_ = CUBLAS_COMPUTE_32F;
    if (s.dtype == DType::f64) compute_ = CUBLAS_COMPUTE_64F;
    else if (s.dtype == DType::f32 && s.math == MathMode::bf16) compute_ = CUBLAS_COMPUTE_32F_FAST_16BF;
    else if (s.dtype == DType::f32 && s.math == MathMode::fp16) compute_ = CUBLAS_COMPUTE_32F_FAST_16F;
    else if (s.dtype == DType::f32 && s.math == MathMode::tf32)
      compute_ = CUBLAS_COMPUTE_32F_FAST_TF32;
    scale_ = s.scale > 0 ? s.scale : 1.0 / std::sqrt(double(s.head_dim));
  }

  void forward(const Tensor& qkv, Tensor& out) override {
    const G g = geom(qkv, "attention forward");
    expect_cuda(out, s_.dtype, "attention forward", "out");
    RT_CHECK(out.numel() == g.n * g.t * g.d, "attention forward: out ", shape_str(out.shape()), " is not [", g.n,
             ", ", g.t, ", ", g.d, "]");
    CudaContext& c = sh_->ctx(qkv);
    const std::size_t es = dtype_size(s_.dtype);
    char* p = static_cast<char*>(probs_.get(static_cast<std::size_t>(g.n * H() * g.tt) * es, qkv.device()));
    const char* x = static_cast<const char*>(qkv.raw());
    char* o = static_cast<char*>(out.raw());
    for (std::int64_t h = 0; h < H(); ++h) {
      const char* q = x + h * hd() * es;
      // S = scale Q K^T
      gemm(c, false, true, g.t, g.t, hd(), scale_, q, g.ld, g.t * g.ld, q + g.d * es, g.ld, g.t * g.ld,
           p + h * g.tt * es, g.t, H() * g.tt, g.n);
    }
    softmax_rows(p, g.n * H() * g.t, g.t, s_.dtype, c.compute());
    for (std::int64_t h = 0; h < H(); ++h)  // O = P V
      gemm(c, false, false, g.t, hd(), g.t, 1.0, p + h * g.tt * es, g.t, H() * g.tt, x + (h * hd() + 2 * g.d) * es,
           g.ld, g.t * g.ld, o + h * hd() * es, g.d, g.t * g.d, g.n);
    n_ = g.n;
  }

  void backward(const Tensor& qkv, const Tensor& dout, Tensor& dqkv) override {
    const G g = geom(qkv, "attention backward");
    expect_cuda(dout, s_.dtype, "attention backward", "dout");
    expect_cuda(dqkv, s_.dtype, "attention backward", "dqkv");
    RT_CHECK(n_ == g.n && dqkv.numel() == qkv.numel() && dout.numel() == g.n * g.t * g.d,
             "attention backward: shapes differ from the forward's");
    CudaContext& c = sh_->ctx(qkv);
    const std::size_t es = dtype_size(s_.dtype);
    const char* p = static_cast<const char*>(probs_.get(0, qkv.device()));
    char* dp = static_cast<char*>(dprobs_.get(static_cast<std::size_t>(g.n * H() * g.tt) * es, qkv.device()));
    const char *x = static_cast<const char*>(qkv.raw()), *dy = static_cast<const char*>(dout.raw());
    char* dx = static_cast<char*>(dqkv.raw());
    for (std::int64_t h = 0; h < H(); ++h) {
      const std::int64_t v = (h * hd() + 2 * g.d) * es;
      const char* dyh = dy + h * hd() * es;
      // dP = dO V^T, dV = P^T dO
      gemm(c, false, true, g.t, g.t, hd(), 1.0, dyh, g.d, g.t * g.d, x + v, g.ld, g.t * g.ld, dp + h * g.tt * es,
           g.t, H() * g.tt, g.n);
      gemm(c, true, false, g.t, hd(), g.t, 1.0, p + h * g.tt * es, g.t, H() * g.tt, dyh, g.d, g.t * g.d, dx + v, g.ld,
           g.t * g.ld, g.n);
    }
    softmax_rows_backward(p, dp, g.n * H() * g.t, g.t, s_.dtype, c.compute());  // dS, in place
    for (std::int64_t h = 0; h < H(); ++h) {
      const std::int64_t q = h * hd() * es, k = (h * hd() + g.d) * es;
      // dQ = scale dS K, dK = scale dS^T Q
      gemm(c, false, false, g.t, hd(), g.t, scale_, dp + h * g.tt * es, g.t, H() * g.tt, x + k, g.ld, g.t * g.ld,
           dx + q, g.ld, g.t * g.ld, g.n);
      gemm(c, true, false, g.t, hd(), g.t, scale_, dp + h * g.tt * es, g.t, H() * g.tt, x + q, g.ld, g.t * g.ld,
           dx + k, g.ld, g.t * g.ld, g.n);
    }
  }

 private:
  struct G {
    std::int64_t n, t, tt, d, ld;
  };
  std::int64_t H() const { return s_.heads; }
  std::int64_t hd() const { return s_.head_dim; }
  G geom(const Tensor& qkv, const char* what) const {
    expect_cuda(qkv, s_.dtype, what, "qkv");
    const std::int64_t d = H() * hd();
    RT_CHECK(qkv.ndim() == 3 && qkv.dim(2) == 3 * d, what, ": qkv ", shape_str(qkv.shape()), " is not [N, T, ",
             3 * d, "]");
    return {qkv.dim(0), qkv.dim(1), qkv.dim(1) * qkv.dim(1), d, 3 * d};
  }

  // Row-major C[m, n] = alpha op(A) op(B) (beta 0), `batch` times with element
  // strides sa, sb, sc: the column-major call with the operands swapped.
  void gemm(CudaContext& c, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
            const void* A, std::int64_t lda, std::int64_t sa, const void* B, std::int64_t ldb, std::int64_t sb, void* C,
            std::int64_t ldc, std::int64_t sc, std::int64_t batch) {
    const float af = static_cast<float>(alpha), zf = 0.f;
    const double zd = 0.0;
    const bool dbl = compute_ == CUBLAS_COMPUTE_64F;
    const void* al = dbl ? static_cast<const void*>(&alpha) : &af;
    const void* be = dbl ? static_cast<const void*>(&zd) : &zf;
    RT_CUBLAS(cublasGemmStridedBatchedEx(c.cublas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         int(n), int(m), int(k), al, B, type_, int(ldb), sb, A, type_, int(lda), sa, be,
                                         C, type_, int(ldc), sc, int(batch), compute_, CUBLAS_GEMM_DEFAULT));
  }

  SharedPtr sh_;
  AttentionSpec s_;
  cudaDataType_t type_;
  cublasComputeType_t compute_;
  double scale_ = 1;
  Scratch probs_, dprobs_;
  std::int64_t n_ = -1;
};

}  // namespace

std::unique_ptr<LayerNormKernel> make_layernorm(SharedPtr sh, const LayerNormSpec& s) {
  return std::make_unique<CudaLayerNorm>(std::move(sh), s);
}
std::unique_ptr<AttentionKernel> make_attention(SharedPtr sh, const AttentionSpec& s) {
  return std::make_unique<CublasAttention>(std::move(sh), s);
}

}  // namespace ringtrain::cuda::nnimpl
