// Transformer kernels on CUDA: LayerNorm (our kernels) and the attention core
// on cuBLAS strided-batched GEMM. Per head h, the N samples' Q, K, V are
// strided views of the qkv activation (row stride 3*H*hd, sample stride
// T*3*H*hd), so one GemmStridedBatchedEx call per head and product covers the
// batch; the probabilities [N, H, T, T] stay for the backward.
// Mixed precision (Backend::bf16_activations): float32 kernels also take
// bfloat16 activations. LayerNorm then reads and writes bf16 rows with float32
// gamma/beta and gradients (statistics in float). Attention keeps its
// operands and the probabilities P in bf16 (tensor cores, float32
// accumulation) and, like the CPU kernel, its scores S and dP in float32: the
// softmax and its backward read float32 and round P and dS once to bf16.
// float16 activations (Backend::fp16_activations) alike: P and dS rounded to
// float16, S and dP float32.
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

  void forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, KernelState& ks) override {
    Tensor& stats_ = state_as<Saved>(ks, "cuda LayerNorm").stats;
    const char* what = "layernorm forward";
    const DType t = act_type(x, s_.dtype, what, "x");
    expect_cuda(y, t, what, "y");
    expect_cuda(gamma, s_.dtype, what, "gamma");
    expect_cuda(beta, s_.dtype, what, "beta");
    const std::int64_t d = s_.features, rows = x.numel() / d;
    RT_CHECK(rows * d == x.numel() && y.numel() == x.numel(), what, ": x ", shape_str(x.shape()),
             " is not [rows, ", d, "] or y differs");
    CudaContext& c = sh_->ctx(x);
    auto* st = static_cast<float*>(kept_buffer(stats_, static_cast<std::size_t>(2 * rows) * sizeof(float), x.device()));
    layernorm_forward(x.raw(), gamma.raw(), beta.raw(), y.raw(), st, st + rows, rows, d, float(s_.eps), t, s_.dtype,
                      c.compute());
  }

  void backward(const Tensor& x, const Tensor& gamma, const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                bool accumulate, KernelState& ks) override {
    Tensor& stats_ = state_as<Saved>(ks, "cuda LayerNorm").stats;
    const char* what = "layernorm backward";
    const DType t = act_type(dy, s_.dtype, what, "dy");
    expect_cuda(x, t, what, "x");
    expect_cuda(gamma, s_.dtype, what, "gamma");
    expect_cuda(dgamma, s_.dtype, what, "dgamma");
    expect_cuda(dbeta, s_.dtype, what, "dbeta");
    const std::int64_t d = s_.features, rows = x.numel() / d;
    RT_CHECK(stats_.defined() && stats_.nbytes() == static_cast<std::size_t>(2 * rows) * sizeof(float), what,
             ": no forward of this shape");
    if (dx.defined()) expect_cuda(dx, t, what, "dx");
    CudaContext& c = sh_->ctx(x);
    auto* st = static_cast<float*>(stats_.raw());
    void* scratch = work_.get(layernorm_scratch_bytes(rows, d), x.device());
    layernorm_backward(x.raw(), gamma.raw(), dy.raw(), st, st + rows, dx.defined() ? dx.raw() : nullptr,
                       dgamma.raw(), dbeta.raw(), rows, d, accumulate, t, s_.dtype, scratch, c.compute());
  }

 private:
  SharedPtr sh_;
  LayerNormSpec s_;
  struct Saved final : KernelState {
    Tensor stats;  // forward to backward: each row's mean and 1/std
  };
  Scratch work_;

 public:
  KernelStatePtr make_state() const override { return std::make_unique<Saved>(); }
};

class CublasAttention final : public AttentionKernel {
 public:
  CublasAttention(SharedPtr sh, const AttentionSpec& s) : sh_(std::move(sh)), s_(s) {
    RT_CHECK(s.heads > 0 && s.head_dim > 0, "cuda attention: heads and head_dim must be positive");
    RT_CHECK(!s.causal, "cuda attention: the cuBLAS kernel is not causal (attention_tiled.cpp is)");
    (void)cublas_type(s.dtype, "attention");  // a dtype cuBLAS takes
    scale_ = s.scale > 0 ? s.scale : 1.0 / std::sqrt(double(s.head_dim));
  }

  void forward(const Tensor& qkv, Tensor& out, KernelState& ks) override {
    Tensor& probs_ = state_as<Saved>(ks, "cuda attention").probs;
    const G g = geom(qkv, "attention forward");
    expect_cuda(out, g.dt, "attention forward", "out");
    RT_CHECK(out.numel() == g.n * g.t * g.d, "attention forward: out ", shape_str(out.shape()), " is not [", g.n,
             ", ", g.t, ", ", g.d, "]");
    CudaContext& c = sh_->ctx(qkv);
    const std::size_t es = dtype_size(g.dt), ss = dtype_size(g.sd), nb = static_cast<std::size_t>(g.n * H() * g.tt);
    char* p = static_cast<char*>(kept_buffer(probs_, nb * es, qkv.device()));
    char* sc = g.sd == g.dt ? p : static_cast<char*>(scores_.get(nb * ss, qkv.device()));  // S in place of P, or float
    const char* x = static_cast<const char*>(qkv.raw());
    char* o = static_cast<char*>(out.raw());
    for (std::int64_t h = 0; h < H(); ++h) {
      const char* q = x + h * hd() * es;
      // S = scale Q K^T
      gemm(c, g.dt, g.sd, false, true, g.t, g.t, hd(), scale_, q, g.ld, g.t * g.ld, q + g.d * es, g.ld, g.t * g.ld,
           sc + h * g.tt * ss, g.t, H() * g.tt, g.n);
    }
    softmax_rows(sc, g.sd, p, g.dt, g.n * H() * g.t, g.t, c.compute());
    for (std::int64_t h = 0; h < H(); ++h)  // O = P V
      gemm(c, g.dt, g.dt, false, false, g.t, hd(), g.t, 1.0, p + h * g.tt * es, g.t, H() * g.tt,
           x + (h * hd() + 2 * g.d) * es, g.ld, g.t * g.ld, o + h * hd() * es, g.d, g.t * g.d, g.n);
    n_ = g.n;
    dt_ = g.dt;
  }

  void backward(const Tensor& qkv, const Tensor& dout, Tensor& dqkv, KernelState& ks) override {
    Tensor& probs_ = state_as<Saved>(ks, "cuda attention").probs;
    const G g = geom(qkv, "attention backward");
    expect_cuda(dout, g.dt, "attention backward", "dout");
    expect_cuda(dqkv, g.dt, "attention backward", "dqkv");
    RT_CHECK(n_ == g.n && dt_ == g.dt && dqkv.numel() == qkv.numel() && dout.numel() == g.n * g.t * g.d,
             "attention backward: shapes or dtype differ from the forward's");
    CudaContext& c = sh_->ctx(qkv);
    const std::size_t es = dtype_size(g.dt), ss = dtype_size(g.sd), nb = static_cast<std::size_t>(g.n * H() * g.tt);
    const char* p = static_cast<const char*>(kept_for_backward(probs_, nb * es, "cuda attention"));
    char* ds = static_cast<char*>(dprobs_.get(nb * es, qkv.device()));
    char* dp = g.sd == g.dt ? ds : static_cast<char*>(scores_.get(nb * ss, qkv.device()));  // dP: in place, or float
    const char *x = static_cast<const char*>(qkv.raw()), *dy = static_cast<const char*>(dout.raw());
    char* dx = static_cast<char*>(dqkv.raw());
    for (std::int64_t h = 0; h < H(); ++h) {
      const std::int64_t v = (h * hd() + 2 * g.d) * es;
      const char* dyh = dy + h * hd() * es;
      // dP = dO V^T, dV = P^T dO
      gemm(c, g.dt, g.sd, false, true, g.t, g.t, hd(), 1.0, dyh, g.d, g.t * g.d, x + v, g.ld, g.t * g.ld,
           dp + h * g.tt * ss, g.t, H() * g.tt, g.n);
      gemm(c, g.dt, g.dt, true, false, g.t, hd(), g.t, 1.0, p + h * g.tt * es, g.t, H() * g.tt, dyh, g.d, g.t * g.d,
           dx + v, g.ld, g.t * g.ld, g.n);
    }
    softmax_rows_backward(p, dp, g.sd, ds, g.dt, g.n * H() * g.t, g.t, c.compute());  // dS
    for (std::int64_t h = 0; h < H(); ++h) {
      const std::int64_t q = h * hd() * es, k = (h * hd() + g.d) * es;
      // dQ = scale dS K, dK = scale dS^T Q
      gemm(c, g.dt, g.dt, false, false, g.t, hd(), g.t, scale_, ds + h * g.tt * es, g.t, H() * g.tt, x + k, g.ld,
           g.t * g.ld, dx + q, g.ld, g.t * g.ld, g.n);
      gemm(c, g.dt, g.dt, true, false, g.t, hd(), g.t, scale_, ds + h * g.tt * es, g.t, H() * g.tt, x + q, g.ld,
           g.t * g.ld, dx + k, g.ld, g.t * g.ld, g.n);
    }
  }

 private:
  struct G {
    std::int64_t n, t, tt, d, ld;
    DType dt, sd;  // activations (qkv, out, P, dS); scores S and dP
  };
  std::int64_t H() const { return s_.heads; }
  std::int64_t hd() const { return s_.head_dim; }
  G geom(const Tensor& qkv, const char* what) const {
    const DType dt = act_type(qkv, s_.dtype, what, "qkv");
    const DType sd = dt == DType::bf16 || dt == DType::f16 ? DType::f32 : dt;
    const std::int64_t d = H() * hd();
    RT_CHECK(qkv.ndim() == 3 && qkv.dim(2) == 3 * d, what, ": qkv ", shape_str(qkv.shape()), " is not [N, T, ",
             3 * d, "]");
    return {qkv.dim(0), qkv.dim(1), qkv.dim(1) * qkv.dim(1), d, 3 * d, dt, sd};
  }

  // Row-major C[m, n] = alpha op(A) op(B) (beta 0), `batch` times with element
  // strides sa, sb, sc: the column-major call with the operands swapped. A, B
  // of dtype ab, C of dtype cd (float32 scores beside 16-bit operands).
  void gemm(CudaContext& c, DType ab, DType cd, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
            double alpha, const void* A, std::int64_t lda, std::int64_t sa, const void* B, std::int64_t ldb,
            std::int64_t sb, void* C, std::int64_t ldc, std::int64_t sc, std::int64_t batch) {
    const float af = static_cast<float>(alpha), zf = 0.f;
    const double zd = 0.0;
    const cublasComputeType_t compute = compute_type(ab, s_.math);
    const bool dbl = compute == CUBLAS_COMPUTE_64F;
    const void* al = dbl ? static_cast<const void*>(&alpha) : &af;
    const void* be = dbl ? static_cast<const void*>(&zd) : &zf;
    const cudaDataType_t at = cublas_type(ab, "attention"), ct = cublas_type(cd, "attention");
    RT_CUBLAS(cublasGemmStridedBatchedEx(c.cublas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         int(n), int(m), int(k), al, B, at, int(ldb), sb, A, at, int(lda), sa, be, C,
                                         ct, int(ldc), sc, int(batch), compute, CUBLAS_GEMM_DEFAULT));
  }

  SharedPtr sh_;
  AttentionSpec s_;
  double scale_ = 1;
  struct Saved final : KernelState {
    Tensor probs;  // forward to backward: the probabilities
  };
  Scratch dprobs_, scores_;

 public:
  KernelStatePtr make_state() const override { return std::make_unique<Saved>(); }
  std::int64_t n_ = -1;
  DType dt_ = DType::f32;
};

}  // namespace

std::unique_ptr<LayerNormKernel> make_layernorm(SharedPtr sh, const LayerNormSpec& s) {
  return std::make_unique<CudaLayerNorm>(std::move(sh), s);
}
// Causal attention (gpt) on the tiled kernel; vit's short non-causal sequences keep the cuBLAS one.
std::unique_ptr<AttentionKernel> make_attention(SharedPtr sh, const AttentionSpec& s) {
  if (s.causal) return make_tiled_attention(std::move(sh), s);
  return std::make_unique<CublasAttention>(std::move(sh), s);
}

}  // namespace ringtrain::cuda::nnimpl
