// Tiled attention on the CPU (FlashAttention-2's schedule, Dao 2023): no
// [T, T] score matrix is ever stored. Per (sample, head), in parallel over
// them:
//  - forward: per block of kRows query rows, the keys in spans of up to kSpan
//    columns with an online softmax (running row maximum m and sum l, the
//    output accumulator rescaled when m grows); causal: only the keys up to the
//    block's last row, the diagonal block masked. Keeps the output (the
//    caller's tensor, not copied) and the row log-sum-exp L = m + log l.
//  - backward: per block of kRows keys, the query rows in spans of up to
//    kSpan (causal: from the block's first key on); P = exp(S - L) is
//    recomputed, dS = P (dP - D) with D = rowsum(dO * O), and dV, dK of the
//    block and dQ of the span accumulate in float32.
// Scores, softmax and accumulators are float32; the products take the
// activation type (bfloat16 activations multiply on the bf16 units, P and dS
// rounded to bf16 as the dense kernel's P is). Tiles are oneDNN matmuls on
// strided views of qkv, one primitive per tile shape, created before the
// parallel loop and run with a per-thread scratchpad (primitives are then
// safe to run concurrently). Kept between forward and backward: N*H*T floats
// and the threads' scratch (O(threads * T * hd), no [T, T] matrix).
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "cpu_backend.hpp"

namespace ringtrain::cpu {
namespace {

using namespace dnnl;

// 128 query rows x 512 keys: the forward's score tile (256 KiB) stays in L2;
// the spans are long enough that each matmul is large next to oneDNN's call
// cost (measured at T = 1024, 12 heads of 64: 128-row blocks 7% faster than 64).
constexpr std::int64_t kRows = 128, kSpan = 512;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) by range reduction x = n ln2 + r (|r| <= ln2/2) and a degree-6
// polynomial (relative error below 2e-7, as libm's expf to within 2 ulp);
// 0 below -87 (where expf is subnormal) and for -inf. A plain loop GCC
// vectorises, unlike calls to expf.
inline float exp_poly(float x) {
  const float xc = std::max(x, -87.f);  // keeps n in range: no overflow in the exponent bits
  const float n = std::nearbyint(xc * 1.44269504088896341f);  // vectorises; floor does not (-ftrapping-math)
  float r = std::fma(n, -0.693145751953125f, xc);
  r = std::fma(n, -1.428606765330187e-06f, r);
  float p = 1.f / 720.f;
  p = std::fma(p, r, 1.f / 120.f);
  p = std::fma(p, r, 1.f / 24.f);
  p = std::fma(p, r, 1.f / 6.f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.f);
  p = std::fma(p, r, 1.f);
  const float s = std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
  return x < -87.f ? 0.f : p * s;
}

// row[j] = exp(row[j] - b) for j < nv, 0 for nv <= j < n (masked); returns the sum.
__attribute__((target_clones("arch=x86-64-v4", "arch=haswell", "default"))) float exp_row(
    float* row, std::int64_t nv, std::int64_t n, float b) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t j = 0; j < nv; ++j) {
    const float e = exp_poly(row[j] - b);
    row[j] = e;
    sum += e;
  }
  for (std::int64_t j = nv; j < n; ++j) row[j] = 0.f;
  return sum;
}

__attribute__((target_clones("arch=x86-64-v4", "arch=haswell", "default"))) float row_max(const float* row,
                                                                                          std::int64_t n) {
  float lane[16];  // 16 running maxima: GCC leaves an `omp simd reduction(max)` scalar here
  std::fill(lane, lane + 16, kNegInf);
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int l = 0; l < 16; ++l) lane[l] = lane[l] < row[j + l] ? row[j + l] : lane[l];
  float m = kNegInf;
  for (float v : lane) m = std::max(m, v);
  for (; j < n; ++j) m = std::max(m, row[j]);
  return m;
}

// dp[j] = p[j] * (dp[j] - d) (the softmax backward of one row).
__attribute__((target_clones("arch=x86-64-v4", "arch=haswell", "default"))) void dsoftmax_row(
    const float* p, float* dp, std::int64_t n, float d) {
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - d);
}

__attribute__((target_clones("arch=x86-64-v4", "arch=haswell", "default"))) void scale_row(float* row,
                                                                                           std::int64_t n, float a) {
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) row[j] *= a;
}

__attribute__((target_clones("arch=x86-64-v4", "arch=haswell", "default"))) float dot(const float* a,
                                                                                      const float* b, std::int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (std::int64_t j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

// The tile products. m: query rows of the tile, n: its keys.
enum class Op { s, pv, dp, dv, dk, dq };

class TiledAttention final : public AttentionKernel {
 public:
  TiledAttention(const AttentionSpec& s, DnnlPtr d) : s_(s), d_(std::move(d)) {
    RT_CHECK(s.dtype == DType::f32, "cpu attention: only float32 is supported, got ", dtype_name(s.dtype));
    RT_CHECK(s.heads > 0 && s.head_dim > 0, "cpu attention: heads and head_dim must be positive");
    scale_ = float(s.scale > 0 ? s.scale : 1.0 / std::sqrt(double(s.head_dim)));
  }

  KernelStatePtr make_state() const override { return std::make_unique<Saved>(); }

  void forward(const Tensor& qkv, Tensor& out, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "cpu attention");
    Tensor &lse_ = sv.lse, &out_ = sv.out;
    std::vector<float>& scratch_ = d_->attention_tiles;
    const Geom g = geom(qkv, "attention forward");
    RT_CHECK(dnnl_type(out, "attention output") == g.t && out.numel() == g.n * g.tok * g.d, "attention forward: out ",
             shape_str(out.shape()), " is not [", g.n, ", ", g.tok, ", ", g.d, "] of the input's type");
    prepare(g);
    const std::int64_t H = s_.heads, T = g.tok, nb = g.n * H;
    if (lse_.numel() != nb * T) lse_ = Tensor::empty({nb * T});
    out_ = out;
    Scratch sc(layout(T), threads(nb), scratchpad_, scratch_);
    const char* x = static_cast<const char*>(qkv.raw());
    char* o = static_cast<char*>(out.raw());
    float* lse = lse_.data<float>();
#pragma omp parallel num_threads(sc.nt)
    {
      Worker w(sc, d_->eng);
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t b = 0; b < nb; ++b) forward_head(g, b, x, o, lse + b * T, w);
    }
  }

  void backward(const Tensor& qkv, const Tensor& dout, Tensor& dqkv, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "cpu attention");
    Tensor &lse_ = sv.lse, &out_ = sv.out;
    std::vector<float>& scratch_ = d_->attention_tiles;
    const Geom g = geom(qkv, "attention backward");
    RT_CHECK(dnnl_type(dout, "attention gradient") == g.t && dnnl_type(dqkv, "attention input gradient") == g.t,
             "attention backward: dout and dqkv must have qkv's type");
    const std::int64_t H = s_.heads, T = g.tok, nb = g.n * H;
    RT_CHECK(lse_.numel() == nb * T && out_.defined() && out_.dtype() == qkv.dtype() &&
                 out_.numel() == g.n * T * g.d && dqkv.numel() == qkv.numel() && dout.numel() == out_.numel(),
             "attention backward: no forward of these shapes before it");
    prepare(g);
    Scratch sc(layout(T), threads(nb), scratchpad_, scratch_);
    const char* x = static_cast<const char*>(qkv.raw());
    char* dx = static_cast<char*>(dqkv.raw());
    const float* lse = lse_.data<float>();
    const char *o = static_cast<const char*>(out_.raw()), *dy = static_cast<const char*>(dout.raw());
#pragma omp parallel num_threads(sc.nt)
    {
      Worker w(sc, d_->eng);
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t b = 0; b < nb; ++b) backward_head(g, b, x, o, dy, dx, lse + b * T, w);
    }
  }


 private:
  struct Geom {
    std::int64_t n, tok, d, ld;  // samples, tokens, H * hd, qkv's row stride (3 d)
    dt t;
    std::size_t es;  // bytes per activation element
  };
  Geom geom(const Tensor& qkv, const char* what) const {
    const dt t = dnnl_type(qkv, "attention qkv");
    const std::int64_t d = s_.heads * s_.head_dim;
    RT_CHECK(qkv.ndim() == 3 && qkv.dim(2) == 3 * d, what, ": qkv ", shape_str(qkv.shape()), " is not [N, T, ",
             3 * d, "]");
    return {qkv.dim(0), qkv.dim(1), d, 3 * d, t, t == dt::f32 ? std::size_t(4) : std::size_t(2)};
  }
  static int threads(std::int64_t heads) {
    return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(omp_get_max_threads(), heads)));
  }

  // Per-thread scratch, in floats: two float32 tiles, two activation-type
  // tiles (counted as floats), the rest; plus oneDNN's scratchpad in bytes.
  struct Layout {
    std::int64_t f32_tiles, act_tiles, rest, small;
  };
  // One layout for both passes (one allocation). Forward: S/P, P in bf16, the
  // output rows (in `rest`), m and l. Backward: P and dP, their bf16 copies,
  // dK and dV of a key block, dQ and D of the whole sequence, two widened rows.
  Layout layout(std::int64_t T) const {
    const std::int64_t hd = s_.head_dim;
    return {2 * kSpan * kRows, kSpan * kRows, 2 * kRows * hd + T * hd + T + 2 * hd, 2 * kRows};
  }
  // The threads' slices of one float32 buffer shared by every attention layer
  // (Dnnl::attention_tiles), grown when a call needs more: fresh pages every
  // call cost more in page faults than the tiles' arithmetic.
  struct Scratch {
    Scratch(const Layout& l, int threads, std::size_t pad, std::vector<float>& keep) : lay(l), nt(threads) {
      per = align(l.f32_tiles) + align(l.act_tiles) + align(l.rest) + align(l.small) +
            align(static_cast<std::int64_t>((pad + 3) / 4));
      if (static_cast<std::int64_t>(keep.size()) < per * nt + 16) keep.resize(static_cast<std::size_t>(per * nt + 16));
      // 64-byte aligned, as the tiles' slices are
      const auto addr = reinterpret_cast<std::uintptr_t>(keep.data());
      buf = keep.data() + ((64 - addr % 64) % 64) / 4;
    }
    static std::int64_t align(std::int64_t n) { return (n + 15) / 16 * 16; }  // 64 bytes
    Layout lay;
    int nt;
    std::int64_t per = 0;
    float* buf = nullptr;
  };
  // A thread's view of the scratch and its oneDNN stream.
  struct Worker {
    Worker(Scratch& s, const engine& eng) : strm(eng) {
      float* base = s.buf + s.per * omp_get_thread_num();
      f = base;
      a = base + Scratch::align(s.lay.f32_tiles);
      rest = a + Scratch::align(s.lay.act_tiles);
      small = rest + Scratch::align(s.lay.rest);
      pad = small + Scratch::align(s.lay.small);
    }
    stream strm;
    float *f, *a, *rest, *small, *pad;
  };

  struct Prim {
    matmul prim;
    memory::desc a, b, c, pad;
  };
  using Key = std::tuple<int, std::int64_t, std::int64_t, int>;

  // Every tile shape a sequence of T tokens uses: f(op, m, n).
  template <typename F>
  void tile_shapes(std::int64_t T, F&& f) const {
    for (std::int64_t r0 = 0; r0 < T; r0 += kRows) {  // forward: row blocks x key spans
      const std::int64_t br = std::min(kRows, T - r0), end = s_.causal ? r0 + br : T;
      for (std::int64_t c0 = 0; c0 < end; c0 += kSpan)
        for (Op op : {Op::s, Op::pv}) f(op, br, std::min(kSpan, end - c0));
    }
    for (std::int64_t c0 = 0; c0 < T; c0 += kRows) {  // backward: key blocks x query spans
      const std::int64_t bc = std::min(kRows, T - c0);
      for (std::int64_t r0 = s_.causal ? c0 : 0; r0 < T; r0 += kSpan)
        for (Op op : {Op::s, Op::dp, Op::dv, Op::dk, Op::dq}) f(op, std::min(kSpan, T - r0), bc);
    }
  }

  // Creates the primitives of this sequence length (serially: the loops only
  // read the cache), each for one thread: a tile runs on one thread, and a
  // primitive's blocking then does not depend on the thread count, so neither
  // do the results.
  void prepare(const Geom& g) {
    if (prepared_.count({g.tok, int(g.t)})) return;
    struct OneThread {
      int saved = omp_get_max_threads();
      OneThread() { omp_set_num_threads(1); }
      ~OneThread() { omp_set_num_threads(saved); }
    } one;
    tile_shapes(g.tok, [&](Op op, std::int64_t m, std::int64_t n) {
      const Key k{int(op), m, n, int(g.t)};
      if (!prims_.count(k)) prims_.emplace(k, make(op, m, n, g));
    });
    prepared_.emplace(g.tok, int(g.t));
  }

  Prim make(Op op, std::int64_t m, std::int64_t n, const Geom& g) {
    const std::int64_t hd = s_.head_dim, ld = g.ld, d = g.d;
    memory::dims ad, as, bd, bs, cd, cs;
    float alpha = 1;
    bool acc = true;
    dt at = g.t, ct = dt::f32;
    switch (op) {
      case Op::s:  // S = scale Q K^T: Q [m, hd] (row stride ld), K^T [hd, n]
        set_matrix(ad, as, m, hd, ld, false), set_matrix(bd, bs, hd, n, ld, true), set_matrix(cd, cs, m, n, n, false);
        alpha = scale_, acc = false;
        break;
      case Op::pv:  // O += P V
        set_matrix(ad, as, m, n, n, false), set_matrix(bd, bs, n, hd, ld, false), set_matrix(cd, cs, m, hd, hd, false);
        break;
      case Op::dp:  // dP = dO V^T: dO [m, hd] (row stride d)
        set_matrix(ad, as, m, hd, d, false), set_matrix(bd, bs, hd, n, ld, true), set_matrix(cd, cs, m, n, n, false);
        acc = false;
        break;
      case Op::dv:  // dV += P^T dO
        set_matrix(ad, as, n, m, n, true), set_matrix(bd, bs, m, hd, d, false), set_matrix(cd, cs, n, hd, hd, false);
        break;
      case Op::dk:  // dK += scale dS^T Q
        set_matrix(ad, as, n, m, n, true), set_matrix(bd, bs, m, hd, ld, false), set_matrix(cd, cs, n, hd, hd, false);
        alpha = scale_;
        break;
      case Op::dq:  // dQ += scale dS K
        set_matrix(ad, as, m, n, n, false), set_matrix(bd, bs, n, hd, ld, false), set_matrix(cd, cs, m, hd, hd, false);
        alpha = scale_;
        break;
    }
    memory::desc a(ad, at, as), b(bd, g.t, bs), c(cd, ct, cs);
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
    if (acc) {
      post_ops po;
      po.append_sum(1.f);
      attr.set_post_ops(po);
    }
    matmul::primitive_desc pd(matmul::desc(a, b, c), attr, d_->eng);
    scratchpad_ = std::max(scratchpad_, pd.scratchpad_desc().get_size());
    return {matmul(pd), a, b, c, pd.scratchpad_desc()};
  }

  void run(Worker& w, Op op, std::int64_t m, std::int64_t n, dt t, const void* a, const void* b, void* c) const {
    const Prim& p = prims_.at(Key{int(op), m, n, int(t)});
    const engine& eng = d_->eng;
    memory ma(p.a, eng, const_cast<void*>(a)), mb(p.b, eng, const_cast<void*>(b)), mc(p.c, eng, c);
    memory pad(p.pad, eng, w.pad);
    p.prim.execute(w.strm, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_SCRATCHPAD, pad}});
    w.strm.wait();
  }

  // The activation-type operand of a float32 tile: itself, or its bf16 copy in `to`.
  static const void* operand(float* tile, std::int64_t n, dt t, float* to) {
    if (t == dt::f32) return tile;
    f32_to_bf16(tile, reinterpret_cast<bfloat16*>(to), n);
    return to;
  }
  // Row r of an activation (float32 or bf16) as float32 (a pointer into it, or widened into `tmp`).
  static const float* row_f32(const char* p, dt t, std::int64_t n, float* tmp) {
    if (t == dt::f32) return reinterpret_cast<const float*>(p);
    bf16_to_f32(reinterpret_cast<const bfloat16*>(p), tmp, n);
    return tmp;
  }
  static void store_row(const float* v, char* p, dt t, std::int64_t n) {
    if (t == dt::f32) std::memcpy(p, v, std::size_t(n) * 4);
    else f32_to_bf16(v, reinterpret_cast<bfloat16*>(p), n);
  }

  // Head b = (sample, head) of the forward: out rows and lse[T].
  void forward_head(const Geom& g, std::int64_t b, const char* x, char* o, float* lse, Worker& w) const {
    const std::int64_t H = s_.heads, hd = s_.head_dim, T = g.tok, n = b / H, h = b % H;
    const std::size_t es = g.es;
    const char* q = x + (std::size_t(n * T) * g.ld + std::size_t(h * hd)) * es;  // row r: q + r * ld * es
    const char* k = q + std::size_t(g.d) * es;
    const char* v = k + std::size_t(g.d) * es;
    char* ob = o + (std::size_t(n * T) * g.d + std::size_t(h * hd)) * es;
    float *s = w.f, *acc = w.rest, *m = w.small, *l = w.small + kRows;
    for (std::int64_t r0 = 0; r0 < T; r0 += kRows) {
      const std::int64_t br = std::min(kRows, T - r0), end = s_.causal ? r0 + br : T;
      std::fill(m, m + br, kNegInf);
      std::fill(l, l + br, 0.f);
      std::fill(acc, acc + br * hd, 0.f);
      for (std::int64_t c0 = 0; c0 < end; c0 += kSpan) {
        const std::int64_t bc = std::min(kSpan, end - c0);
        run(w, Op::s, br, bc, g.t, q + std::size_t(r0 * g.ld) * es, k + std::size_t(c0 * g.ld) * es, s);
        for (std::int64_t i = 0; i < br; ++i) {
          // causal: row r0 + i sees keys <= r0 + i; at least key c0 (c0 <= r0: spans start at multiples of kRows)
          const std::int64_t nv = s_.causal ? std::min(bc, r0 + i + 1 - c0) : bc;
          float* si = s + i * bc;
          const float mx = std::max(m[i], row_max(si, nv));
          const float corr = m[i] == kNegInf ? 0.f : std::exp(m[i] - mx);
          l[i] = l[i] * corr + exp_row(si, nv, bc, mx);
          if (corr != 1.f) scale_row(acc + i * hd, hd, corr);
          m[i] = mx;
        }
        run(w, Op::pv, br, bc, g.t, operand(s, br * bc, g.t, w.a), v + std::size_t(c0 * g.ld) * es, acc);
      }
      for (std::int64_t i = 0; i < br; ++i) {
        scale_row(acc + i * hd, hd, 1.f / l[i]);
        store_row(acc + i * hd, ob + std::size_t((r0 + i) * g.d) * es, g.t, hd);
        lse[r0 + i] = m[i] + std::log(l[i]);
      }
    }
  }

  void backward_head(const Geom& g, std::int64_t b, const char* x, const char* o, const char* dout, char* dx,
                     const float* lse, Worker& w) const {
    const std::int64_t H = s_.heads, hd = s_.head_dim, T = g.tok, n = b / H, h = b % H;
    const std::size_t es = g.es, qoff = (std::size_t(n * T) * g.ld + std::size_t(h * hd)) * es,
                      ooff = (std::size_t(n * T) * g.d + std::size_t(h * hd)) * es, dd = std::size_t(g.d) * es;
    const char *q = x + qoff, *k = q + dd, *v = k + dd, *ob = o + ooff, *dob = dout + ooff;
    char *dq = dx + qoff, *dk = dq + dd, *dv = dk + dd;
    const std::int64_t tile = kSpan * kRows;
    float *p = w.f, *dp = w.f + tile, *p16 = w.a, *ds16 = w.a + tile / 2;  // bf16 tiles: half a float tile each
    float *dkacc = w.rest, *dvacc = dkacc + kRows * hd, *dqacc = dvacc + kRows * hd, *D = dqacc + T * hd,
          *tmp = D + T;
    for (std::int64_t r = 0; r < T; ++r)  // D = rowsum(dO * O)
      D[r] = dot(row_f32(ob + std::size_t(r * g.d) * es, g.t, hd, tmp),
                 row_f32(dob + std::size_t(r * g.d) * es, g.t, hd, tmp + hd), hd);
    std::fill(dqacc, dqacc + T * hd, 0.f);
    for (std::int64_t c0 = 0; c0 < T; c0 += kRows) {
      const std::int64_t bc = std::min(kRows, T - c0);
      std::fill(dkacc, dkacc + 2 * kRows * hd, 0.f);
      for (std::int64_t r0 = s_.causal ? c0 : 0; r0 < T; r0 += kSpan) {
        const std::int64_t br = std::min(kSpan, T - r0);
        const std::size_t rq = std::size_t(r0 * g.ld) * es, ro = std::size_t(r0 * g.d) * es,
                          ck = std::size_t(c0 * g.ld) * es;
        run(w, Op::s, br, bc, g.t, q + rq, k + ck, p);
        run(w, Op::dp, br, bc, g.t, dob + ro, v + ck, dp);
        for (std::int64_t i = 0; i < br; ++i) {
          const std::int64_t nv = s_.causal ? std::clamp<std::int64_t>(r0 + i + 1 - c0, 0, bc) : bc;
          exp_row(p + i * bc, nv, bc, lse[r0 + i]);
          dsoftmax_row(p + i * bc, dp + i * bc, bc, D[r0 + i]);
        }
        const void* pa = operand(p, br * bc, g.t, p16);
        const void* dsa = operand(dp, br * bc, g.t, ds16);
        run(w, Op::dv, br, bc, g.t, pa, dob + ro, dvacc);
        run(w, Op::dk, br, bc, g.t, dsa, q + rq, dkacc);
        run(w, Op::dq, br, bc, g.t, dsa, k + ck, dqacc + r0 * hd);
      }
      for (std::int64_t j = 0; j < bc; ++j) {
        store_row(dkacc + j * hd, dk + std::size_t((c0 + j) * g.ld) * es, g.t, hd);
        store_row(dvacc + j * hd, dv + std::size_t((c0 + j) * g.ld) * es, g.t, hd);
      }
    }
    for (std::int64_t r = 0; r < T; ++r) store_row(dqacc + r * hd, dq + std::size_t(r * g.ld) * es, g.t, hd);
  }

  AttentionSpec s_;
  DnnlPtr d_;
  float scale_ = 1;
  // Forward to backward: the row log-sum-exp [N * H * T] and the forward's
  // output (the caller's tensor). The threads' tiles and per-sequence rows
  // (O(threads * (kRows * kSpan + T * hd))) live within a call: one buffer
  // for every layer (Dnnl::attention_tiles), not one per layer and slot.
  struct Saved final : KernelState {
    Tensor lse, out;
  };
  std::map<Key, Prim> prims_;
  std::set<std::pair<std::int64_t, int>> prepared_;  // (T, type) whose primitives exist
  std::size_t scratchpad_ = 0;  // bytes: the largest primitive's
};

}  // namespace

std::unique_ptr<AttentionKernel> make_tiled_attention(const AttentionSpec& s, DnnlPtr d) {
  return std::make_unique<TiledAttention>(s, std::move(d));
}

}  // namespace ringtrain::cpu
