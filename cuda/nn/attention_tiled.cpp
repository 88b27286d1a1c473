// Causal attention on CUDA: the tiled kernels of kernels/attention.cu
// (FlashAttention-2's schedule). No [N, H, T, T] probabilities are kept: the
// state holds the row log-sum-exp [N, H, T] (float32) and the caller's output
// tensor itself (its values must be the forward's when backward runs, as for
// the CPU's tiled kernel). float32, bfloat16 and float16 activations; every
// sum in float32.
#include <cmath>

#include "nn/common.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda::nnimpl {
namespace {

class TiledAttention final : public AttentionKernel {
 public:
  TiledAttention(SharedPtr sh, const AttentionSpec& s) : sh_(std::move(sh)), s_(s) {
    RT_CHECK(s.heads > 0 && s.head_dim > 0, "cuda attention: heads and head_dim must be positive");
    RT_CHECK(s.head_dim <= 256, "cuda attention: the tiled kernel takes head widths up to 256, got ", s.head_dim);
    RT_CHECK(s.dtype == DType::f32 || s.dtype == DType::bf16 || s.dtype == DType::f16,
             "cuda attention: the tiled kernel takes float32, bfloat16 or float16, got ", dtype_name(s.dtype));
    scale_ = static_cast<float>(s.scale > 0 ? s.scale : 1.0 / std::sqrt(double(s.head_dim)));
  }
  KernelStatePtr make_state() const override { return std::make_unique<Saved>(); }

  void forward(const Tensor& qkv, Tensor& out, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "cuda attention");
    const G g = geom(qkv, "attention forward");
    expect_cuda(out, g.dt, "attention forward", "out");
    RT_CHECK(out.numel() == g.n * g.t * g.d, "attention forward: out ", shape_str(out.shape()), " is not [", g.n,
             ", ", g.t, ", ", g.d, "]");
    CudaContext& c = sh_->ctx(qkv);
    auto* lse = static_cast<float*>(
        kept_buffer(sv.lse, static_cast<std::size_t>(g.n * s_.heads * g.t) * sizeof(float), qkv.device()));
    sv.out = out;
    flash_attention_forward(qkv.raw(), out.raw(), lse, g.n, g.t, s_.heads, s_.head_dim, scale_, s_.causal, g.dt,
                            c.compute());
  }

  void backward(const Tensor& qkv, const Tensor& dout, Tensor& dqkv, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "cuda attention");
    const G g = geom(qkv, "attention backward");
    expect_cuda(dout, g.dt, "attention backward", "dout");
    expect_cuda(dqkv, g.dt, "attention backward", "dqkv");
    RT_CHECK(dqkv.numel() == qkv.numel() && dout.numel() == g.n * g.t * g.d && sv.out.defined() &&
                 sv.out.dtype() == g.dt && sv.out.numel() == dout.numel(),
             "attention backward: no forward of these shapes before it");
    const auto* lse = static_cast<const float*>(kept_for_backward(
        sv.lse, static_cast<std::size_t>(g.n * s_.heads * g.t) * sizeof(float), "cuda attention"));
    CudaContext& c = sh_->ctx(qkv);
    void* dd = work_.get(flash_attention_scratch_bytes(g.n, g.t, s_.heads), qkv.device());
    flash_attention_backward(qkv.raw(), sv.out.raw(), dout.raw(), lse, dqkv.raw(), dd, g.n, g.t, s_.heads,
                             s_.head_dim, scale_, s_.causal, g.dt, c.compute());
  }

 private:
  struct G {
    std::int64_t n, t, d;
    DType dt;
  };
  G geom(const Tensor& qkv, const char* what) const {
    const DType dt = act_type(qkv, s_.dtype, what, "qkv");
    const std::int64_t d = s_.heads * s_.head_dim;
    RT_CHECK(qkv.ndim() == 3 && qkv.dim(2) == 3 * d, what, ": qkv ", shape_str(qkv.shape()), " is not [N, T, ",
             3 * d, "]");
    return {qkv.dim(0), qkv.dim(1), d, dt};
  }

  SharedPtr sh_;
  AttentionSpec s_;
  float scale_ = 1;
  struct Saved final : KernelState {
    Tensor lse, out;  // forward to backward: the row log-sum-exp, and the caller's output (not copied)
  };
  Scratch work_;  // D = rowsum(dO * O), used within one backward
};

}  // namespace

std::unique_ptr<AttentionKernel> make_tiled_attention(SharedPtr sh, const AttentionSpec& s) {
  return std::make_unique<TiledAttention>(std::move(sh), s);
}

}  // namespace ringtrain::cuda::nnimpl
