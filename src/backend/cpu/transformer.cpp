// Transformer kernels on the CPU: LayerNorm (our loops, AVX2 clones), dense
// attention (oneDNN matmuls over all heads at once around oneDNN's softmax;
// causal attention is tiled, attention_tiled.cpp), and the token ops of a
// vision transformer.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "cpu_backend.hpp"

namespace ringtrain::cpu {
namespace {

using namespace dnnl;

void check(const Tensor& t, const char* what, const char* arg) {
  RT_CHECK(t.defined() && t.dtype() == DType::f32 && t.device().is_cpu(), what, ": ", arg,
           " must be a float32 CPU tensor");
}
// An activation: float32 or bfloat16.
void check_act(const Tensor& t, const char* what, const char* arg) {
  RT_CHECK(t.defined() && (t.dtype() == DType::f32 || t.dtype() == DType::bf16) && t.device().is_cpu(), what, ": ",
           arg, " must be a float32 or bfloat16 CPU tensor");
}
void same_type(const Tensor& a, const Tensor& b, const char* what) {
  RT_CHECK(a.dtype() == b.dtype(), what, ": ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()),
           " tensors (activations must have one type)");
}
inline float ld(float v) { return v; }
inline float ld(bfloat16 v) { return to_f32(v); }
inline void st(float& d, float v) { d = v; }
inline void st(bfloat16& d, float v) { d = to_bf16(v); }

// ---- LayerNorm ------------------------------------------------------------
// Row kernels, cloned for AVX2+FMA so that GCC vectorises them (the build's
// baseline ISA is plain x86-64).
__attribute__((target_clones("arch=haswell", "default"))) void ln_forward_rows(
    const float* x, const float* g, const float* b, float* y, float* mean, float* rstd, std::int64_t r0,
    std::int64_t r1, std::int64_t d, float eps) {
  for (std::int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * d;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (std::int64_t j = 0; j < d; ++j) s += xr[j];
    const float m = s / float(d);
    float v = 0;
#pragma omp simd reduction(+ : v)
    for (std::int64_t j = 0; j < d; ++j) v += (xr[j] - m) * (xr[j] - m);
    const float rs = 1.0f / std::sqrt(v / float(d) + eps);
    mean[r] = m;
    rstd[r] = rs;
    float* yr = y + r * d;
#pragma omp simd
    for (std::int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - m) * rs * g[j] + b[j];
  }
}

// dx (when non-null) and this chunk's dgamma/dbeta sums (added into dg, db).
__attribute__((target_clones("arch=haswell", "default"))) void ln_backward_rows(
    const float* x, const float* g, const float* dy, const float* mean, const float* rstd, float* dx, float* dg,
    float* db, std::int64_t r0, std::int64_t r1, std::int64_t d) {
  for (std::int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * d;
    const float* gr = dy + r * d;
    const float m = mean[r], rs = rstd[r];
    float a = 0, c = 0;
#pragma omp simd reduction(+ : a, c)
    for (std::int64_t j = 0; j < d; ++j) {
      const float xh = (xr[j] - m) * rs, gd = gr[j] * g[j];
      a += gd;
      c += gd * xh;
      dg[j] += gr[j] * xh;
      db[j] += gr[j];
    }
    if (!dx) continue;
    a /= float(d);
    c /= float(d);
    float* dr = dx + r * d;
#pragma omp simd
    for (std::int64_t j = 0; j < d; ++j) dr[j] = rs * (gr[j] * g[j] - a - (xr[j] - m) * rs * c);
  }
}

int threads_for(std::int64_t work) { return work < (1 << 14) ? 1 : omp_get_max_threads(); }

class CpuLayerNorm final : public LayerNormKernel {
 public:
  explicit CpuLayerNorm(const LayerNormSpec& s) : s_(s) {
    RT_CHECK(s.dtype == DType::f32, "cpu LayerNorm: only float32 is supported, got ", dtype_name(s.dtype));
    RT_CHECK(s.features > 0, "cpu LayerNorm: features must be positive");
  }

  KernelStatePtr make_state() const override { return std::make_unique<Saved>(); }

  void forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "cpu LayerNorm");
    auto &mean_ = sv.mean, &rstd_ = sv.rstd;
    if (x.dtype() != DType::bf16) check(x, "LayerNorm forward", "x");
    const std::int64_t d = s_.features, rows = x.numel() / d;
    RT_CHECK(x.numel() == rows * d && y.numel() == x.numel(), "LayerNorm forward: x ", shape_str(x.shape()),
             " is not [rows, ", d, "] or y differs");
    if (static_cast<std::int64_t>(mean_.size()) != rows) {
      mean_.resize(static_cast<std::size_t>(rows));
      rstd_.resize(static_cast<std::size_t>(rows));
    }
    const float *pg = gamma.data<float>(), *pb = beta.data<float>();
    const int nt = threads_for(x.numel());
    if (x.dtype() == DType::bf16) {  // row by row through float32
      RT_CHECK(y.dtype() == DType::bf16, "LayerNorm forward: y must have x's type");
      const bfloat16* px = x.data<bfloat16>();
      bfloat16* py = y.data<bfloat16>();
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int t = 0; t < nt; ++t) {
        std::vector<float> xr(static_cast<std::size_t>(d)), yr(xr.size());
        for (std::int64_t r = rows * t / nt; r < rows * (t + 1) / nt; ++r) {
          bf16_to_f32(px + r * d, xr.data(), d);
          ln_forward_rows(xr.data(), pg, pb, yr.data(), mean_.data() + r, rstd_.data() + r, 0, 1, d, float(s_.eps));
          f32_to_bf16(yr.data(), py + r * d, d);
        }
      }
      return;
    }
    check(y, "LayerNorm forward", "y");
    const float* px = x.data<float>();
    float* py = y.data<float>();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < nt; ++t) {
      const std::int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
      ln_forward_rows(px, pg, pb, py, mean_.data(), rstd_.data(), r0, r1, d, float(s_.eps));
    }
  }

  // Forward to backward: each row's mean and 1/std.
  void backward(const Tensor& x, const Tensor& gamma, const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                bool accumulate, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "cpu LayerNorm");
    const auto &mean_ = sv.mean, &rstd_ = sv.rstd;
    const bool bf = dy.dtype() == DType::bf16;
    if (!bf) check(dy, "LayerNorm backward", "dy");
    RT_CHECK(x.dtype() == dy.dtype() && (!dx.defined() || dx.dtype() == dy.dtype()),
             "LayerNorm backward: x, dy and dx must have one type");
    const std::int64_t d = s_.features, rows = x.numel() / d;
    RT_CHECK(static_cast<std::int64_t>(mean_.size()) == rows, "LayerNorm backward: no forward of this shape");
    const int nt = threads_for(x.numel());
    part_.assign(static_cast<std::size_t>(2 * nt * d), 0.f);  // per thread: dgamma, dbeta
    const float* pg = gamma.data<float>();
    if (bf) {  // row by row through float32
      const bfloat16 *px = x.data<bfloat16>(), *pd = dy.data<bfloat16>();
      bfloat16* pdx = dx.defined() ? dx.data<bfloat16>() : nullptr;
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int t = 0; t < nt; ++t) {
        float* pp = part_.data() + 2 * t * d;
        std::vector<float> xr(static_cast<std::size_t>(d)), gr(xr.size()), dr(xr.size());
        for (std::int64_t r = rows * t / nt; r < rows * (t + 1) / nt; ++r) {
          bf16_to_f32(px + r * d, xr.data(), d);
          bf16_to_f32(pd + r * d, gr.data(), d);
          ln_backward_rows(xr.data(), pg, gr.data(), mean_.data() + r, rstd_.data() + r, pdx ? dr.data() : nullptr,
                           pp, pp + d, 0, 1, d);
          if (pdx) f32_to_bf16(dr.data(), pdx + r * d, d);
        }
      }
    } else {
      const float *px = x.data<float>(), *pd = dy.data<float>();
      float* pdx = dx.defined() ? dx.data<float>() : nullptr;
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int t = 0; t < nt; ++t) {
        const std::int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
        float* pp = part_.data() + 2 * t * d;
        ln_backward_rows(px, pg, pd, mean_.data(), rstd_.data(), pdx, pp, pp + d, r0, r1, d);
      }
    }
    float *dg = dgamma.data<float>(), *db = dbeta.data<float>();
    for (std::int64_t j = 0; j < d; ++j) {
      float sg = accumulate ? dg[j] : 0.f, sb = accumulate ? db[j] : 0.f;
      for (int t = 0; t < nt; ++t) {
        sg += part_[static_cast<std::size_t>(2 * t * d + j)];
        sb += part_[static_cast<std::size_t>((2 * t + 1) * d + j)];
      }
      dg[j] = sg;
      db[j] = sb;
    }
  }

 private:
  struct Saved final : KernelState {
    std::vector<float> mean, rstd;  // per row, forward to backward
  };
  LayerNormSpec s_;
  std::vector<float> part_;
};

// ---- attention --------------------------------------------------------------
// Dense (non-causal: vit's 49 tokens, where one batched matmul over all heads
// beats per-head tiles). The per-(sample, head) products are oneDNN matmuls over all N x H heads at
// once, on strided 4-D views [N, H, T, hd] of qkv (row stride 3D, head stride
// hd); the scores S and their gradient are float32 (softmax and its backward
// in float32), the kept probabilities P and every matmul input are the
// activation type: bfloat16 activations multiply on the bf16 units with
// float32 accumulation.
class CpuAttention final : public AttentionKernel {
 public:
  CpuAttention(const AttentionSpec& s, DnnlPtr d) : s_(s), d_(std::move(d)), cast_(d_) {
    RT_CHECK(s.dtype == DType::f32, "cpu attention: only float32 is supported, got ", dtype_name(s.dtype));
    RT_CHECK(s.heads > 0 && s.head_dim > 0, "cpu attention: heads and head_dim must be positive");
    RT_CHECK(!s.causal, "cpu attention: the dense kernel is not causal (attention_tiled.cpp is)");
    scale_ = float(s.scale > 0 ? s.scale : 1.0 / std::sqrt(double(s.head_dim)));
  }

  KernelStatePtr make_state() const override { return std::make_unique<Saved>(); }

  void forward(const Tensor& qkv, Tensor& out, KernelState& ks) override {
    Tensor& probs_ = state_as<Saved>(ks, "cpu attention").probs;
    const Dims g = dims(qkv, "attention forward");
    RT_CHECK(dnnl_type(out, "attention output") == g.t && out.numel() == g.n * g.tok * g.d, "attention forward: out ",
             shape_str(out.shape()), " is not [", g.n, ", ", g.tok, ", ", g.d, "] of the input's type");
    const std::int64_t nb = g.n * s_.heads, tt = g.tok * g.tok;
    const bool f32 = g.t == dt::f32;
    if (probs_.numel() != nb * tt || probs_.dtype() != qkv.dtype()) probs_ = Tensor::empty({nb * tt}, qkv.dtype());
    float* sc = f32 ? probs_.data<float>() : scratch(d_->scratch[0], nb * tt);
    const char* x = static_cast<const char*>(qkv.raw());
    const std::size_t es = qkv.dtype() == DType::f32 ? 4 : 2, off_k = es * g.d, off_v = 2 * es * g.d;
    // S = scale Q K^T (float32), softmax in place, P in the activation type, O = P V.
    mm(Op::qk, g).run(d_->strm, x, x + off_k, sc);
    Softmax& sm = softmax(nb * g.tok, g.tok);
    sm.a.set_data_handle(sc);
    sm.fwd.execute(d_->strm, {{DNNL_ARG_SRC, sm.a}, {DNNL_ARG_DST, sm.a}});
    d_->strm.wait();
    if (!f32) cast_.run(sc, dt::f32, probs_.raw(), dt::bf16, nb * tt);
    mm(Op::pv, g).run(d_->strm, probs_.raw(), x + off_v, out.raw());
  }

  void backward(const Tensor& qkv, const Tensor& dout, Tensor& dqkv, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "cpu attention");
    Tensor &probs_ = sv.probs, &dp_ = sv.dp;
    const Dims g = dims(qkv, "attention backward");
    RT_CHECK(dnnl_type(dout, "attention gradient") == g.t && dnnl_type(dqkv, "attention input gradient") == g.t,
             "attention backward: dout and dqkv must have qkv's type");
    const std::int64_t nb = g.n * s_.heads, tt = g.tok * g.tok;
    RT_CHECK(probs_.numel() == nb * tt && dqkv.numel() == qkv.numel() && dout.numel() == g.n * g.tok * g.d,
             "attention backward: shapes differ from the forward's");
    const bool f32 = g.t == dt::f32;
    if (dp_.numel() != nb * tt || dp_.dtype() != qkv.dtype()) dp_ = Tensor::empty({nb * tt}, qkv.dtype());
    const char* x = static_cast<const char*>(qkv.raw());
    char* dx = static_cast<char*>(dqkv.raw());
    const std::size_t es = f32 ? 4 : 2, off_k = es * g.d, off_v = 2 * es * g.d;
    // dP = dO V^T (float32), dV = P^T dO
    float* dpf = f32 ? dp_.data<float>() : scratch(d_->scratch[0], nb * tt);
    mm(Op::dp, g).run(d_->strm, dout.raw(), x + off_v, dpf);
    mm(Op::dv, g).run(d_->strm, probs_.raw(), dout.raw(), dx + off_v);
    // dS = P * (dP - rowsum(dP * P)), in place, float32
    const float* pf = f32 ? probs_.data<float>() : nullptr;
    if (!f32) {
      pf = scratch(d_->scratch[1], nb * tt);
      cast_.run(probs_.raw(), dt::bf16, const_cast<float*>(pf), dt::f32, nb * tt);
    }
    Softmax& sm = softmax(nb * g.tok, g.tok);
    sm.a.set_data_handle(const_cast<float*>(pf));
    sm.b.set_data_handle(dpf);
    sm.bwd.execute(d_->strm, {{DNNL_ARG_DST, sm.a}, {DNNL_ARG_DIFF_DST, sm.b}, {DNNL_ARG_DIFF_SRC, sm.b}});
    d_->strm.wait();
    if (!f32) cast_.run(dpf, dt::f32, dp_.raw(), dt::bf16, nb * tt);
    // dQ = scale dS K, dK = scale dS^T Q
    mm(Op::dq, g).run(d_->strm, dp_.raw(), x + off_k, dx);
    mm(Op::dk, g).run(d_->strm, dp_.raw(), x, dx + off_k);
  }

 private:
  struct Dims {
    std::int64_t n, tok, d, ld;
    dt t;
  };
  Dims dims(const Tensor& qkv, const char* what) const {
    const dt t = dnnl_type(qkv, "attention qkv");
    const std::int64_t d = s_.heads * s_.head_dim;
    RT_CHECK(qkv.ndim() == 3 && qkv.dim(2) == 3 * d, what, ": qkv ", shape_str(qkv.shape()), " is not [N, T, ",
             3 * d, "]");
    return {qkv.dim(0), qkv.dim(1), d, 3 * d, t};
  }

  // Shared float32 scratch (Dnnl::scratch), grown to n elements.
  static float* scratch(std::vector<float>& v, std::int64_t n) {
    if (static_cast<std::int64_t>(v.size()) < n) v.assign(static_cast<std::size_t>(n), 0.f);
    return v.data();
  }

  enum class Op { qk, pv, dp, dv, dq, dk };
  // One of the six products over all heads: per (n, h) a [rows, k] x [k, cols]
  // matmul whose operands are strided views ([N, H, ., .] with batch strides).
  Matmul& mm(Op op, const Dims& g) {
    auto key = std::make_tuple(int(op), g.n, g.tok, int(g.t));
    auto it = mm_.find(key);
    if (it != mm_.end()) return it->second;
    const std::int64_t H = s_.heads, T = g.tok, hd = s_.head_dim, ld = g.ld, d = g.d;
    // A view of qkv (row stride ld), of out/dout (row stride d), or of the dense [N, H, T, T] scores.
    struct View {
      std::int64_t sn, sh, rows, cols, ld;
      bool trans;
    };
    const View qkv{T * ld, hd, T, hd, ld, false}, qkvT{T * ld, hd, hd, T, ld, true}, o{T * d, hd, T, hd, d, false},
        p{H * T * T, T * T, T, T, T, false}, pT{H * T * T, T * T, T, T, T, true};
    auto put = [&](memory::dims& dm, memory::dims& st, const View& v) {
      dm = {g.n, H};
      st = {v.sn, v.sh};
      set_matrix(dm, st, v.rows, v.cols, v.ld, v.trans);
    };
    MatmulShape m;
    m.a_type = m.b_type = m.c_type = g.t;
    View a{}, b{}, c{};
    switch (op) {
      case Op::qk: a = qkv, b = qkvT, c = p, m.alpha = scale_, m.c_type = dt::f32; break;
      case Op::pv: a = p, b = qkv, c = o; break;
      case Op::dp: a = o, b = qkvT, c = p, m.c_type = dt::f32; break;
      case Op::dv: a = pT, b = o, c = qkv; break;
      case Op::dq: a = p, b = qkv, c = qkv, m.alpha = scale_; break;
      case Op::dk: a = pT, b = qkv, c = qkv, m.alpha = scale_; break;
    }
    put(m.a, m.a_strides, a);
    put(m.b, m.b_strides, b);
    put(m.c, m.c_strides, c);
    return mm_.emplace(key, Matmul(m, d_->eng)).first->second;
  }

  struct Softmax {
    softmax_forward fwd;
    softmax_backward bwd;
    memory a, b;
  };
  // oneDNN softmax over the last axis of [rows, cols], cached per shape.
  Softmax& softmax(std::int64_t rows, std::int64_t cols) {
    auto key = std::make_pair(rows, cols);
    auto it = sm_.find(key);
    if (it != sm_.end()) return it->second;
    auto& eng = d_->eng;
    auto md = plain_md({rows, cols}, tag::ab);
    softmax_forward::primitive_desc fpd({prop_kind::forward_training, md, 1}, eng);
    softmax_backward::primitive_desc bpd({md, md, 1}, eng, fpd);
    Softmax s{softmax_forward(fpd), softmax_backward(bpd), memory(md, eng, DNNL_MEMORY_NONE),
              memory(md, eng, DNNL_MEMORY_NONE)};
    return sm_.emplace(key, std::move(s)).first->second;
  }

  AttentionSpec s_;
  DnnlPtr d_;
  Caster cast_;
  float scale_ = 1;
  // Forward to backward: P; dS (backward scratch, in the activation type; the
  // float32 scores' gradient in place when f32) goes with it, so that
  // recomputation frees both.
  struct Saved final : KernelState {
    Tensor probs, dp;
  };
  std::map<std::pair<std::int64_t, std::int64_t>, Softmax> sm_;
  std::map<std::tuple<int, std::int64_t, std::int64_t, int>, Matmul> mm_;
};

}  // namespace

std::unique_ptr<LayerNormKernel> make_layernorm(const LayerNormSpec& s, DnnlPtr) {
  return std::make_unique<CpuLayerNorm>(s);
}
// Causal attention is tiled (attention_tiled.cpp): it never stores the
// masked half, nor any [T, T] matrix.
std::unique_ptr<AttentionKernel> make_attention(const AttentionSpec& s, DnnlPtr d) {
  if (s.causal) return make_tiled_attention(s, std::move(d));
  return std::make_unique<CpuAttention>(s, std::move(d));
}

// ---- token ops --------------------------------------------------------------
namespace {
struct PatchGeom {
  std::int64_t n, c, h, w, p, hp, wp, k;
};
PatchGeom patch_geom(const Shape& xs, std::int64_t p, const Tensor& tokens, const char* what) {
  RT_CHECK(xs.size() == 4 && p > 0 && xs[2] % p == 0 && xs[3] % p == 0, what, ": image ", shape_str(xs),
           " is not divisible into ", p, "x", p, " patches");
  PatchGeom g{xs[0], xs[1], xs[2], xs[3], p, xs[2] / p, xs[3] / p, xs[1] * p * p};
  RT_CHECK(tokens.numel() == g.n * g.hp * g.wp * g.k, what, ": tokens ", shape_str(tokens.shape()), " are not [",
           g.n, ", ", g.hp * g.wp, ", ", g.k, "]");
  return g;
}

// to_tokens: x -> tokens, else tokens -> x (both overwrite).
template <typename T>
void patch_copy(T* img, T* tok, const PatchGeom& g, bool to_tokens) {
#pragma omp parallel for collapse(2) schedule(static) if (g.n * g.c * g.h * g.w > (1 << 16))
  for (std::int64_t n = 0; n < g.n; ++n)
    for (std::int64_t i = 0; i < g.hp; ++i)
      for (std::int64_t j = 0; j < g.wp; ++j) {
        T* t = tok + ((n * g.hp + i) * g.wp + j) * g.k;
        for (std::int64_t c = 0; c < g.c; ++c)
          for (std::int64_t a = 0; a < g.p; ++a) {
            T* row = img + ((n * g.c + c) * g.h + i * g.p + a) * g.w + j * g.p;
            T* tr = t + (c * g.p + a) * g.p;
            for (std::int64_t b = 0; b < g.p; ++b) {
              if (to_tokens) tr[b] = row[b];
              else row[b] = tr[b];
            }
          }
      }
}
}  // namespace

void patchify(const Tensor& x, std::int64_t p, Tensor& out) {
  check_act(x, "patchify", "x");
  check_act(out, "patchify", "out");
  same_type(x, out, "patchify");
  const PatchGeom g = patch_geom(x.shape(), p, out, "patchify");
  if (x.dtype() == DType::bf16) return patch_copy(x.data<bfloat16>(), out.data<bfloat16>(), g, true);
  patch_copy(x.data<float>(), out.data<float>(), g, true);
}

void unpatchify(const Tensor& dout, std::int64_t p, Tensor& dx) {
  check_act(dout, "unpatchify", "dout");
  check_act(dx, "unpatchify", "dx");
  same_type(dout, dx, "unpatchify");
  const PatchGeom g = patch_geom(dx.shape(), p, dout, "unpatchify");
  if (dx.dtype() == DType::bf16) return patch_copy(dx.data<bfloat16>(), dout.data<bfloat16>(), g, false);
  patch_copy(dx.data<float>(), dout.data<float>(), g, false);
}

namespace {
// x's [outer, m, inner] view for a broadcast of m = b.numel() entries over `inner` elements each.
std::int64_t broadcast_outer(const Tensor& x, const Tensor& b, std::int64_t inner, const char* what) {
  const std::int64_t m = b.numel(), per = m * inner, outer = per > 0 ? x.numel() / per : 0;
  RT_CHECK(m > 0 && inner > 0 && outer * per == x.numel(), what, ": ", shape_str(b.shape()), " with inner ", inner,
           " does not broadcast over ", shape_str(x.shape()));
  return outer;
}
}  // namespace

void add_broadcast(const Tensor& x, const Tensor& b, std::int64_t inner, Tensor& out) {
  check_act(x, "add_broadcast", "x");
  check(b, "add_broadcast", "b");
  check_act(out, "add_broadcast", "out");
  same_type(x, out, "add_broadcast");
  const std::int64_t outer = broadcast_outer(x, b, inner, "add_broadcast"), m = b.numel();
  RT_CHECK(out.numel() == x.numel(), "add_broadcast: out ", shape_str(out.shape()), " is not x's size ",
           shape_str(x.shape()));
  if (x.dtype() == DType::bf16) {  // bfloat16 activations, float32 parameter
    const bfloat16* px = x.data<bfloat16>();
    bfloat16* po = out.data<bfloat16>();
    const float* pb = b.data<float>();
    for (std::int64_t i = 0; i < outer * m * inner; ++i) po[i] = to_bf16(to_f32(px[i]) + pb[(i / inner) % m]);
    return;
  }
  const float *px = x.data<float>(), *pb = b.data<float>();
  float* po = out.data<float>();
  if (inner == 1) {
    for (std::int64_t r = 0; r < outer; ++r) add(px + r * m, pb, po + r * m, m);
    return;
  }
  for (std::int64_t r = 0; r < outer * m; ++r) {
    const float v = pb[r % m];
    for (std::int64_t k = 0; k < inner; ++k) po[r * inner + k] = px[r * inner + k] + v;
  }
}

// Rows (inner = 1) are added in float, row by row (vectorised); a per-channel
// sum over many pixels (inner > 1) is accumulated in double.
void sum_broadcast(const Tensor& dy, std::int64_t inner, Tensor& db, bool accumulate) {
  check_act(dy, "sum_broadcast", "dy");
  check(db, "sum_broadcast", "db");
  const std::int64_t outer = broadcast_outer(dy, db, inner, "sum_broadcast"), m = db.numel();
  if (dy.dtype() == DType::bf16) {  // into the float32 gradient, summed in double per entry
    const bfloat16* g = dy.data<bfloat16>();
    float* o = db.data<float>();
    std::vector<double> acc(static_cast<std::size_t>(m), 0.0);
    for (std::int64_t r = 0; r < outer; ++r)
      for (std::int64_t c = 0; c < m; ++c)
        for (std::int64_t k = 0; k < inner; ++k) acc[std::size_t(c)] += to_f32(g[(r * m + c) * inner + k]);
    for (std::int64_t c = 0; c < m; ++c) o[c] = static_cast<float>(accumulate ? o[c] + acc[std::size_t(c)] : acc[std::size_t(c)]);
    return;
  }
  const float* g = dy.data<float>();
  float* o = db.data<float>();
  if (inner == 1) {
    if (!accumulate) std::fill(o, o + m, 0.f);
    for (std::int64_t r = 0; r < outer; ++r) add_into(o, g + r * m, m);
    return;
  }
  // Per image plane a float sum in 16 lanes (vectorised; a plane holds at most a few
  // thousand elements), the planes of a channel added in double. A serial double sum
  // is bound by the adder's latency: 1 ms a step for a 64-channel 14x14 layer at batch 64.
  auto plane_sum = [](const float* p, std::int64_t n) {
    float lane[16] = {};
    std::int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      for (int l = 0; l < 16; ++l) lane[l] += p[i + l];
    float s = 0;
    for (float v : lane) s += v;
    for (; i < n; ++i) s += p[i];
    return s;
  };
  for (std::int64_t c = 0; c < m; ++c) {
    double s = 0;
    for (std::int64_t n = 0; n < outer; ++n) s += plane_sum(g + (n * m + c) * inner, inner);
    o[c] = static_cast<float>(accumulate ? o[c] + s : s);
  }
}

template <typename T>
void token_mean_t(const T* x, T* y, std::int64_t n, std::int64_t t, std::int64_t d) {
  const float inv = 1.0f / float(t);
  std::vector<float> acc(static_cast<std::size_t>(d));
  for (std::int64_t i = 0; i < n; ++i) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (std::int64_t k = 0; k < t; ++k) {
      const T* xr = x + (i * t + k) * d;
      for (std::int64_t j = 0; j < d; ++j) acc[std::size_t(j)] += ld(xr[j]);
    }
    for (std::int64_t j = 0; j < d; ++j) st(y[i * d + j], acc[std::size_t(j)] * inv);
  }
}

template <typename T>
void token_mean_backward_t(const T* dy, T* dx, std::int64_t n, std::int64_t t, std::int64_t d) {
  const float inv = 1.0f / float(t);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t k = 0; k < t; ++k)
      for (std::int64_t j = 0; j < d; ++j) st(dx[(i * t + k) * d + j], ld(dy[i * d + j]) * inv);
}

void token_mean(const Tensor& x, Tensor& y) {
  check_act(x, "token_mean", "x");
  check_act(y, "token_mean", "y");
  same_type(x, y, "token_mean");
  RT_CHECK(x.ndim() == 3 && y.numel() == x.dim(0) * x.dim(2), "token_mean: x ", shape_str(x.shape()),
           " is not [N, T, D] or y ", shape_str(y.shape()), " is not [N, D]");
  if (x.dtype() == DType::bf16) return token_mean_t(x.data<bfloat16>(), y.data<bfloat16>(), x.dim(0), x.dim(1), x.dim(2));
  token_mean_t(x.data<float>(), y.data<float>(), x.dim(0), x.dim(1), x.dim(2));
}

void token_mean_backward(const Tensor& dy, Tensor& dx) {
  check_act(dy, "token_mean backward", "dy");
  check_act(dx, "token_mean backward", "dx");
  same_type(dy, dx, "token_mean backward");
  RT_CHECK(dx.ndim() == 3 && dy.numel() == dx.dim(0) * dx.dim(2), "token_mean backward: dx ",
           shape_str(dx.shape()), " is not [N, T, D] or dy ", shape_str(dy.shape()), " is not [N, D]");
  if (dx.dtype() == DType::bf16)
    return token_mean_backward_t(dy.data<bfloat16>(), dx.data<bfloat16>(), dx.dim(0), dx.dim(1), dx.dim(2));
  token_mean_backward_t(dy.data<float>(), dx.data<float>(), dx.dim(0), dx.dim(1), dx.dim(2));
}

}  // namespace ringtrain::cpu
