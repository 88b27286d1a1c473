// The CPU backend: oneDNN for convolution, pooling, batch norm, eltwise and
// the matmuls of Linear and attention (float32 or bfloat16), simple OpenMP loops for the element-wise rest.
// Threads follow OMP_NUM_THREADS (oneDNN uses the OpenMP runtime; OpenBLAS
// is set to the same count, so OMP_NUM_THREADS=1 makes everything serial).
#include "cpu_backend.hpp"
#include "simd.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ringtrain/nn/rng.hpp"

namespace ringtrain {
namespace cpu {

Arg::Arg(const dnnl::memory::desc& plain, const dnnl::memory::desc& want, const dnnl::engine& eng, bool input,
         bool force_copy, bool external_inner) {
  user_ = dnnl::memory(plain, eng, DNNL_MEMORY_NONE);
  separate_ = force_copy || plain != want;
  if (!separate_) return;
  inner_ = external_inner ? dnnl::memory(want, eng, DNNL_MEMORY_NONE) : dnnl::memory(want, eng);
  if (input) {
    to_ = dnnl::reorder(user_, inner_);
  } else {
    to_ = dnnl::reorder(inner_, user_);
    dnnl::post_ops po;
    po.append_sum(1.f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    to_add_ = dnnl::reorder(dnnl::reorder::primitive_desc(inner_, user_, attr));
  }
}

dnnl::memory& Arg::in(const void* p, dnnl::stream& s) {
  user_.set_data_handle(const_cast<void*>(p));
  if (!separate_) return user_;
  to_.execute(s, user_, inner_);
  return inner_;
}

dnnl::memory& Arg::out(void* p) {
  user_.set_data_handle(p);
  return separate_ ? inner_ : user_;
}

void Arg::finish(dnnl::stream& s, bool accumulate) {
  if (!separate_) return;
  (accumulate ? to_add_ : to_).execute(s, inner_, user_);
}

dnnl::memory make_scratch(const dnnl::primitive_desc_base& pd, const dnnl::engine& eng) {
  return dnnl::memory(pd.scratchpad_desc(), eng);
}

namespace {

// Splits [0, n) into one contiguous chunk per OpenMP thread.
template <typename F>
void parallel_chunks(std::int64_t n, F&& f) {
  const int nt = n < (1 << 15) ? 1 : omp_get_max_threads();
  if (nt <= 1) return f(std::int64_t{0}, n);
#pragma omp parallel num_threads(nt)
  {
    const std::int64_t t = omp_get_thread_num(), chunk = (n + nt - 1) / nt;
    const std::int64_t b = std::min(n, t * chunk), e = std::min(n, b + chunk);
    if (b < e) f(b, e);
  }
}

}  // namespace

void relu_mask(const float* y, const float* dy, float* dst, std::int64_t n) {
  parallel_chunks(n, [&](std::int64_t b, std::int64_t e) {
    if (const CpuSimd* v = cpu_simd()) return v->relu_mask(y, dy, dst, b, e);
    for (std::int64_t i = b; i < e; ++i) dst[i] = y[i] > 0.f ? dy[i] : 0.f;
  });
}

// bfloat16: y > 0 is the bits read as int16 > 0 (sign clear, not zero); a branch-free select that vectorises.
__attribute__((target_clones("arch=x86-64-v4", "arch=haswell", "default"))) void relu_mask16_range(
    const std::uint16_t* y, const std::uint16_t* dy, std::uint16_t* dst, std::int64_t b, std::int64_t e) {
  for (std::int64_t i = b; i < e; ++i) dst[i] = static_cast<std::int16_t>(y[i]) > 0 ? dy[i] : std::uint16_t{0};
}

void relu_mask(const bfloat16* y, const bfloat16* dy, bfloat16* dst, std::int64_t n) {
  parallel_chunks(n, [&](std::int64_t b, std::int64_t e) { relu_mask16_range(&y->bits, &dy->bits, &dst->bits, b, e); });
}

void add(const float* a, const float* b, float* out, std::int64_t n) {
  parallel_chunks(n, [&](std::int64_t lo, std::int64_t hi) {
    if (const CpuSimd* v = cpu_simd()) return v->add(a, b, out, lo, hi);
    for (std::int64_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
  });
}

void add_into(float* out, const float* a, std::int64_t n) { add(out, a, out, n); }

namespace {

void check_f32(const Tensor& t, const char* what) {
  RT_CHECK(t.dtype() == DType::f32, "cpu backend: ", what, " must be float32, got ", dtype_name(t.dtype()));
  RT_CHECK(t.device().is_cpu(), "cpu backend: ", what, " is on ", t.device().str());
}

template <typename L>
std::int64_t label_at(const Tensor& labels, std::int64_t i) {
  return static_cast<std::int64_t>(labels.data<L>()[i]);
}

std::int64_t get_label(const Tensor& labels, std::int64_t i, std::int64_t k) {
  std::int64_t y = labels.dtype() == DType::i32 ? label_at<std::int32_t>(labels, i) : label_at<std::int64_t>(labels, i);
  RT_CHECK(y >= 0 && y < k, "label ", y, " at row ", i, " is outside [0, ", k, ")");
  return y;
}

// exp(x) in double for x <= 0 (a logit minus its row's maximum or
// log-sum-exp): x = n ln2 + r, |r| <= ln2/2, the Taylor polynomial to r^11
// (relative error below 1e-14), 2^n through the exponent bits; 0 below -700.
// A plain loop body GCC vectorises, unlike calls to exp: the cross-entropy
// over a 50257-token vocabulary is 2 exps per logit.
inline double exp_neg(double x) {
  const double xc = std::max(x, -700.0);  // keeps n in range: no overflow in the exponent bits
  const double n = std::nearbyint(xc * 1.4426950408889634);  // vectorises; floor does not (-ftrapping-math)
  double r = std::fma(n, -6.93147180369123816490e-01, xc);
  r = std::fma(n, -1.90821492927058770002e-10, r);
  double p = std::fma(1.0 / 39916800, r, 1.0 / 3628800);  // 1/11!, 1/10!
  p = std::fma(p, r, 1.0 / 362880);
  p = std::fma(p, r, 1.0 / 40320);
  p = std::fma(p, r, 1.0 / 5040);
  p = std::fma(p, r, 1.0 / 720);
  p = std::fma(p, r, 1.0 / 120);
  p = std::fma(p, r, 1.0 / 24);
  p = std::fma(p, r, 1.0 / 6);
  p = std::fma(p, r, 0.5);
  p = std::fma(p, r, 1.0);
  p = std::fma(p, r, 1.0);
  const double s = std::bit_cast<double>((static_cast<std::int64_t>(n) + 1023) << 52);
  return x < -700 ? 0.0 : p * s;
}

// One row of the softmax cross-entropy: the maximum, sum exp(z - m) and sum z.
__attribute__((target_clones("arch=x86-64-v4", "arch=haswell", "default"))) void xent_row_sums(
    const float* z, std::int64_t k, double& m, double& se, double& sz) {
  float lane[16];  // 16 running maxima: GCC leaves an `omp simd reduction(max)` scalar here
  std::fill(lane, lane + 16, z[0]);
  std::int64_t j0 = 0;
  for (; j0 + 16 <= k; j0 += 16)
    for (int l = 0; l < 16; ++l) lane[l] = lane[l] < z[j0 + l] ? z[j0 + l] : lane[l];
  float mf = z[0];
  for (float v : lane) mf = std::max(mf, v);
  for (; j0 < k; ++j0) mf = std::max(mf, z[j0]);
  double a = 0, b = 0;
  const double md = mf;
#pragma omp simd reduction(+ : a, b)
  for (std::int64_t j = 0; j < k; ++j) {
    a += exp_neg(double(z[j]) - md);
    b += double(z[j]);
  }
  m = md, se = a, sz = b;
}
// dz[j] = (exp(z[j] - lse) - off) * inv.
__attribute__((target_clones("arch=x86-64-v4", "arch=haswell", "default"))) void xent_row_grad(
    const float* z, std::int64_t k, double lse, double off, double inv, float* dz) {
#pragma omp simd
  for (std::int64_t j = 0; j < k; ++j) dz[j] = static_cast<float>((exp_neg(double(z[j]) - lse) - off) * inv);
}

// Dropout over float or bfloat16 elements: arithmetic in float, the result rounded once.
inline float as_f32(float v) { return v; }
inline float as_f32(bfloat16 v) { return to_f32(v); }
template <typename T>
T from_f32(float v) {
  if constexpr (std::is_same_v<T, bfloat16>) return to_bf16(v); else return v;
}
template <typename T>
void dropout_forward_loop(const T* px, double p, std::uint64_t seed, std::uint64_t stream, std::uint64_t first,
                          std::uint8_t* pm, T* py, std::int64_t n) {
  const float pf = static_cast<float>(p), scale = static_cast<float>(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    bool keep = dropout_keep(seed, stream, first + static_cast<std::uint64_t>(i), pf);
    pm[i] = keep;
    py[i] = from_f32<T>(keep ? as_f32(px[i]) * scale : 0.f);
  }
}
template <typename T>
void dropout_backward_loop(const T* pd, const std::uint8_t* pm, double p, T* px, std::int64_t n) {
  const float scale = static_cast<float>(1.0 / (1.0 - p));
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) px[i] = from_f32<T>(pm[i] ? as_f32(pd[i]) * scale : 0.f);
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() : d_(std::make_shared<Dnnl>()), cast_(d_) {
    openblas_set_num_threads(std::max(1, omp_get_max_threads()));
  }
  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string name() const override {
    const dnnl_version_t* v = dnnl_version();
    return cat("cpu (oneDNN ", v->major, ".", v->minor, ".", v->patch, " + OpenBLAS, ", omp_get_max_threads(),
               " threads)");
  }

  std::unique_ptr<Conv2dKernel> conv2d(const Conv2dSpec& s) override { return cpu::make_conv2d(s, d_); }
  bool conv_fuses_pool() const override { return true; }
  bool splits_weight_grad() const override { return true; }
  std::unique_ptr<LinearKernel> linear(const LinearSpec& s) override { return cpu::make_linear(s, d_); }
  std::unique_ptr<BatchNormKernel> batchnorm(const BatchNormSpec& s) override { return cpu::make_batchnorm(s, d_); }
  std::unique_ptr<Pool2dKernel> pool2d(const Pool2dSpec& s) override { return cpu::make_pool2d(s, d_); }
  std::unique_ptr<EltwiseKernel> eltwise(Eltwise op, DType dt) override {
    RT_CHECK(dt == DType::f32, "cpu backend: eltwise supports float32 only, got ", dtype_name(dt));
    return cpu::make_eltwise(op, d_);
  }
  std::unique_ptr<LayerNormKernel> layernorm(const LayerNormSpec& s) override { return cpu::make_layernorm(s, d_); }
  std::unique_ptr<AttentionKernel> attention(const AttentionSpec& s) override { return cpu::make_attention(s, d_); }
  void patchify(const Tensor& x, std::int64_t p, Tensor& out) override { cpu::patchify(x, p, out); }
  void unpatchify(const Tensor& dout, std::int64_t p, Tensor& dx) override { cpu::unpatchify(dout, p, dx); }
  void add_broadcast(const Tensor& x, const Tensor& b, std::int64_t inner, Tensor& out) override {
    cpu::add_broadcast(x, b, inner, out);
  }
  void sum_broadcast(const Tensor& dy, std::int64_t inner, Tensor& db, bool accumulate) override {
    cpu::sum_broadcast(dy, inner, db, accumulate);
  }
  void embedding_forward(const Tensor& ids, std::int64_t vocab, std::int64_t first, const Tensor& weight,
                         const Tensor& pos, Tensor& rows, Tensor& y) override {
    cpu::embedding_forward(ids, vocab, first, weight, pos, rows, y);
  }
  void embedding_backward(const Tensor& dy, const Tensor& rows, Tensor& dweight, Tensor& dpos) override {
    cpu::embedding_backward(dy, rows, dweight, dpos);
  }
  void vocab_row_max(const Tensor& logits, const Tensor& labels, int part, Tensor& maxes, Tensor& best) override {
    cpu::vocab_row_max(logits, labels, part, maxes, best);
  }
  void vocab_xent_sums(const Tensor& logits, const Tensor& labels, int part, const Tensor& maxes,
                       Tensor& sums) override {
    cpu::vocab_xent_sums(logits, labels, part, maxes, sums);
  }
  double vocab_xent_finish(const Tensor& logits, const Tensor& labels, int part, const Tensor& maxes,
                           const Tensor& sums, Tensor& dlogits) override {
    return cpu::vocab_xent_finish(logits, labels, part, maxes, sums, dlogits);
  }
  void vocab_count_hits(const Tensor& maxes, const Tensor& best, const Tensor& labels, int part, std::int64_t first,
                        Tensor& hits) override {
    cpu::vocab_count_hits(maxes, best, labels, part, first, hits);
  }
  // Ring attention's blocks (context parallelism): ring_blocks.cpp.
  void ring_block_forward(const Tensor& qkv, const Tensor& kv, const RingBlockSpec& b, bool first, Tensor& acc,
                          Tensor& m, Tensor& l, Tensor& work, const std::function<void()>& poll) override {
    cpu::ring_block_forward(qkv, kv, b, first, acc, m, l, work, poll);
  }
  void ring_block_finish(const Tensor& acc, const Tensor& m, const Tensor& l, std::int64_t heads, Tensor& out,
                         Tensor& lse) override {
    cpu::ring_block_finish(acc, m, l, heads, out, lse);
  }
  void attention_rowdot(const Tensor& out, const Tensor& dout, std::int64_t heads, Tensor& D) override {
    cpu::attention_rowdot(out, dout, heads, D);
  }
  void ring_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& dout, const Tensor& lse,
                           const Tensor& D, const RingBlockSpec& b, Tensor& dqkv, Tensor& dkv, Tensor& work,
                           const std::function<void()>& poll) override {
    cpu::ring_block_backward(qkv, kv, dout, lse, D, b, dqkv, dkv, work, poll);
  }
  // ---- mixture of experts (moe_ops.cpp) ----
  void moe_route(Tensor& probs, const Tensor& bias, int k, Tensor& expert, Tensor& gate, Tensor& psum) override {
    cpu::moe_route(probs, bias, k, expert, gate, psum);
  }
  void moe_gather_rows(const Tensor& src, const Tensor& idx, Tensor& dst) override {
    cpu::moe_gather_rows(src, idx, dst);
  }
  void moe_combine(const Tensor& rows, const Tensor& row, const Tensor& gate, int k, const Tensor& tokens, Tensor& y,
                   bool accumulate) override {
    cpu::moe_combine(rows, row, gate, k, tokens, y, accumulate);
  }
  void moe_combine_backward(const Tensor& dy, const Tensor& rows, const Tensor& row, const Tensor& gate, int k,
                            Tensor& dgate, Tensor& drows) override {
    cpu::moe_combine_backward(dy, rows, row, gate, k, dgate, drows);
  }
  void moe_router_backward(const Tensor& probs, const Tensor& expert, const Tensor& gate, const Tensor& dgate,
                           const Tensor& f, double aux_g, Tensor& dlogit) override {
    cpu::moe_router_backward(probs, expert, gate, dgate, f, aux_g, dlogit);
  }
  void batched_gemm(Device dev, const BatchedGemm& g) override {
    RT_CHECK(dev.is_cpu(), "batched_gemm: the CPU backend got ", dev.str());
    cpu::batched_gemm(g);
  }
  // ---- end mixture of experts ----
  void token_mean(const Tensor& x, Tensor& y) override { cpu::token_mean(x, y); }
  void token_mean_backward(const Tensor& dy, Tensor& dx) override { cpu::token_mean_backward(dy, dx); }

  void add(const Tensor& a, const Tensor& b, Tensor& out) override {
    RT_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add: sizes differ: ", shape_str(a.shape()), ", ",
             shape_str(b.shape()), ", ", shape_str(out.shape()));
    if (a.dtype() == DType::bf16) {  // bfloat16 activations: the sum in float32, rounded once
      RT_CHECK(b.dtype() == DType::bf16 && out.dtype() == DType::bf16, "add: inputs and output must have one type");
      const bfloat16 *pa = a.data<bfloat16>(), *pb = b.data<bfloat16>();
      bfloat16* po = out.data<bfloat16>();
      const std::int64_t n = a.numel();
#pragma omp parallel for simd schedule(static)
      for (std::int64_t i = 0; i < n; ++i) po[i] = to_bf16(to_f32(pa[i]) + to_f32(pb[i]));
      return;
    }
    check_f32(a, "add input");
    check_f32(b, "add input");
    check_f32(out, "add output");
    cpu::add(a.data<float>(), b.data<float>(), out.data<float>(), a.numel());
  }

  bool bf16_activations() const override { return true; }
  bool bf16_images() const override { return true; }
  std::string bf16_isa() const override { return cpu::bf16_isa(); }
  void cast(const Tensor& src, Tensor& dst) override {
    RT_CHECK(src.numel() == dst.numel(), "cast: sizes differ: ", shape_str(src.shape()), " vs ",
             shape_str(dst.shape()));
    cast_.run(src.raw(), dnnl_type(src, "cast input"), dst.raw(), dnnl_type(dst, "cast output"), src.numel());
  }

  void axpy(double alpha, const Tensor& x, Tensor& y) override {
    check_f32(x, "axpy x");
    check_f32(y, "axpy y");
    RT_CHECK(x.numel() == y.numel(), "axpy: sizes differ: ", x.numel(), " vs ", y.numel());
    cblas_saxpy(static_cast<blasint>(x.numel()), static_cast<float>(alpha), x.data<float>(), 1, y.data<float>(), 1);
  }

  void dropout_forward(const Tensor& x, double p, std::uint64_t seed, std::uint64_t stream, std::uint64_t first,
                       Tensor& mask, Tensor& y) override {
    RT_CHECK(mask.dtype() == DType::u8 && mask.numel() == x.numel() && y.numel() == x.numel(),
             "dropout: mask (u8) and output must match the input");
    if (x.dtype() == DType::bf16) {  // the same keep decisions; the scaled value rounded once
      RT_CHECK(y.dtype() == DType::bf16, "dropout: output type differs from the input's");
      return dropout_forward_loop(x.data<bfloat16>(), p, seed, stream, first, mask.data<std::uint8_t>(),
                                  y.data<bfloat16>(), x.numel());
    }
    check_f32(x, "dropout input");
    dropout_forward_loop(x.data<float>(), p, seed, stream, first, mask.data<std::uint8_t>(), y.data<float>(),
                         x.numel());
  }

  void dropout_backward(const Tensor& dy, const Tensor& mask, double p, Tensor& dx) override {
    if (dy.dtype() == DType::bf16) {
      RT_CHECK(dx.dtype() == DType::bf16, "dropout backward: dx type differs from dy's");
      return dropout_backward_loop(dy.data<bfloat16>(), mask.data<std::uint8_t>(), p, dx.data<bfloat16>(),
                                   dy.numel());
    }
    check_f32(dy, "dropout gradient");
    dropout_backward_loop(dy.data<float>(), mask.data<std::uint8_t>(), p, dx.data<float>(), dy.numel());
  }

  double softmax_xent(const Tensor& logits, const Tensor& labels, double smoothing, Tensor& dlogits) override {
    check_f32(logits, "logits");
    const std::int64_t n = logits.dim(0), k = logits.dim(1);
    const float* z = logits.data<float>();
    float* dz = dlogits.defined() ? dlogits.data<float>() : nullptr;
    std::vector<std::int64_t> y(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) y[static_cast<std::size_t>(i)] = get_label(labels, i, k);
    const double off = smoothing / double(k), on = 1.0 - smoothing + off;
    double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const float* zi = z + i * k;
      double m, se, sz;
      xent_row_sums(zi, k, m, se, sz);
      const double lse = m + std::log(se);
      const std::int64_t yi = y[static_cast<std::size_t>(i)];
      // -sum_j t_j (z_j - lse), t = off everywhere plus (on - off) at the label
      total -= (on - off) * (double(zi[yi]) - lse) + off * (sz - double(k) * lse);
      if (!dz) continue;
      xent_row_grad(zi, k, lse, off, 1.0 / double(n), dz + i * k);
      dz[i * k + yi] = static_cast<float>((exp_neg(double(zi[yi]) - lse) - on) / double(n));
    }
    return total / double(n);
  }

  std::int64_t count_correct(const Tensor& logits, const Tensor& labels) override {
    check_f32(logits, "logits");
    const std::int64_t n = logits.dim(0), k = logits.dim(1);
    const float* z = logits.data<float>();
    std::int64_t c = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const float* zi = z + i * k;
      std::int64_t best = std::max_element(zi, zi + k) - zi;  // first maximum
      c += best == get_label(labels, i, k);
    }
    return c;
  }

 private:
  DnnlPtr d_;
  Caster cast_;
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<cpu::CpuBackend>(); }

}  // namespace ringtrain
