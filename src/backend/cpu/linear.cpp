// Linear on oneDNN matmul: y = x w^T + b (bias and ReLU fused as post-ops);
// dx = dy w; dw (+)= dy^T x (sum post-op when accumulating); db (+)= column
// sums of dy. Activations (x, y, dy, dx) and the weight are float32, or
// bfloat16 copies in mixed precision (then oneDNN multiplies in bf16 and
// accumulates in float32); dw and db are always the float32 gradients.
// oneDNN beats OpenBLAS 0.3.21 sgemm on every vit shape at one thread
// (bench_nn_transformer_kernels, docs/data/vit_profile.txt).
#include <map>
#include <vector>

#include "cpu_backend.hpp"

namespace ringtrain::cpu {
namespace {

class CpuLinear final : public LinearKernel {
 public:
  CpuLinear(const LinearSpec& s, DnnlPtr d) : s_(s), d_(std::move(d)) {
    RT_CHECK(s.dtype == DType::f32, "cpu Linear: parameters must be float32, got ", dtype_name(s.dtype));
  }

  void forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) override {
    const dt t = types(x, w, "forward"), yt = dnnl_type(y, "Linear output");
    // bf16 inputs may give a float32 output (an LM head's logits, for the loss)
    RT_CHECK(yt == t || (t == dt::bf16 && yt == dt::f32), "cpu Linear: output dtype differs from the input's");
    mm(Kind::fwd, x.dim(0), t, false, yt).run(d_->strm, x.raw(), w.raw(), y.raw(), s_.bias ? b.raw() : nullptr);
  }

  void backward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& dy, Tensor& dx, Tensor& dw,
                Tensor& db, bool accumulate) override {
    const dt t = types(x, w, "backward");
    RT_CHECK(dnnl_type(dy, "Linear gradient") == t, "cpu Linear: gradient dtype differs from the input's");
    const std::int64_t n = x.dim(0), out = s_.out_features;
    const void* g = dy.raw();
    if (s_.fuse_relu) {
      if (masked_.numel() != dy.numel() || masked_.dtype() != dy.dtype()) masked_ = Tensor::empty(dy.shape(), dy.dtype());
      if (t == dt::f32) {
        relu_mask(y.data<float>(), dy.data<float>(), masked_.data<float>(), dy.numel());
      } else {  // bf16: keep where y > 0 (sign bit clear, not zero)
        const std::uint16_t *py = &y.data<bfloat16>()->bits, *pd = &dy.data<bfloat16>()->bits;
        std::uint16_t* pm = &masked_.data<bfloat16>()->bits;
        const std::int64_t m = dy.numel();
#pragma omp parallel for simd schedule(static)
        for (std::int64_t i = 0; i < m; ++i) pm[i] = (py[i] & 0x8000u) == 0 && py[i] != 0 ? pd[i] : 0;
      }
      g = masked_.raw();
    }
    if (dx.defined()) mm(Kind::dx, n, t, false).run(d_->strm, g, w.raw(), dx.raw());
    if (!dw.defined()) return;  // input half of a split backward
    RT_CHECK(dw.dtype() == DType::f32 && (!s_.bias || db.dtype() == DType::f32),
             "cpu Linear: parameter gradients must be float32");
    mm(Kind::dw, n, t, accumulate).run(d_->strm, g, x.raw(), dw.raw());
    if (!s_.bias) return;
    float* pdb = db.data<float>();
    if (!accumulate) std::fill(pdb, pdb + out, 0.f);
    if (t == dt::f32) {
      for (std::int64_t i = 0; i < n; ++i) add_into(pdb, static_cast<const float*>(g) + i * out, out);
      return;
    }
    const bfloat16* gb = static_cast<const bfloat16*>(g);
    row_.resize(static_cast<std::size_t>(out));
    for (std::int64_t i = 0; i < n; ++i) {  // vectorised: widen a row, then add it
      bf16_to_f32(gb + i * out, row_.data(), out);
      add_into(pdb, row_.data(), out);
    }
  }

 private:
  enum class Kind { fwd, dx, dw };

  dt types(const Tensor& x, const Tensor& w, const char* what) const {
    const dt t = dnnl_type(x, "Linear input");
    RT_CHECK(dnnl_type(w, "Linear weight") == t, "cpu Linear ", what, ": the weight is ", dtype_name(w.dtype()),
             " but the input ", dtype_name(x.dtype()), " (bfloat16 activations take a bfloat16 weight copy)");
    return t;
  }

  // The matmul of one pass for n rows, built once per (pass, rows, type, accumulate).
  Matmul& mm(Kind k, std::int64_t n, dt t, bool acc, dt out = dt::undef) {
    if (out == dt::undef) out = t;
    auto key = std::make_tuple(int(k), n, int(t) * 16 + int(out), acc);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    const std::int64_t in = s_.in_features, out_f = s_.out_features;
    MatmulShape m;
    m.a_type = m.b_type = t;
    if (k == Kind::fwd) {  // [n, in] x w^T [in, out] -> [n, out]
      set_matrix(m.a, m.a_strides, n, in, in, false);
      set_matrix(m.b, m.b_strides, in, out_f, in, true);
      set_matrix(m.c, m.c_strides, n, out_f, out_f, false);
      m.c_type = out;
      m.bias = s_.bias;
      m.relu = s_.fuse_relu;
    } else if (k == Kind::dx) {  // dy [n, out] x w [out, in] -> [n, in]
      set_matrix(m.a, m.a_strides, n, out_f, out_f, false);
      set_matrix(m.b, m.b_strides, out_f, in, in, false);
      set_matrix(m.c, m.c_strides, n, in, in, false);
      m.c_type = t;
    } else {  // dy^T [out, n] x x [n, in] -> dw [out, in], float32
      set_matrix(m.a, m.a_strides, out_f, n, out_f, true);
      set_matrix(m.b, m.b_strides, n, in, in, false);
      set_matrix(m.c, m.c_strides, out_f, in, in, false);
      m.c_type = dt::f32;
      m.accumulate = acc;
    }
    return cache_.emplace(key, Matmul(m, d_->eng)).first->second;
  }

  LinearSpec s_;
  DnnlPtr d_;
  Tensor masked_;
  std::vector<float> row_;
  std::map<std::tuple<int, std::int64_t, int, bool>, Matmul> cache_;
};

}  // namespace

std::unique_ptr<LinearKernel> make_linear(const LinearSpec& s, DnnlPtr d) {
  return std::make_unique<CpuLinear>(s, std::move(d));
}

}  // namespace ringtrain::cpu
