// The mixture-of-experts layer's loops on the CPU (Backend::moe_route,
// moe_gather_rows, moe_combine, moe_combine_backward, moe_router_backward,
// batched_gemm; nn/moe.cpp calls them). They are the layer's host loops as
// they were, moved here unchanged: the CPU's numerics stay what they were,
// and cuda/kernels/moe.cu computes the same sums in the same order.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "cpu_backend.hpp"

namespace ringtrain::cpu {
namespace {

void expect(const Tensor& t, DType dt, std::int64_t numel, const char* what, const char* arg) {
  RT_CHECK(t.defined() && t.device().is_cpu() && t.dtype() == dt && (numel < 0 || t.numel() == numel), what, ": ",
           arg, " must be a ", dtype_name(dt), " CPU tensor", numel >= 0 ? cat(" of ", numel, " elements") : "",
           ", got ", t.defined() ? cat(dtype_name(t.dtype()), " ", shape_str(t.shape())) : "undefined");
}

}  // namespace

void moe_route(Tensor& probs, const Tensor& bias, int k, Tensor& expert, Tensor& gate, Tensor& psum) {
  const char* what = "moe_route";
  RT_CHECK(probs.ndim() == 2 && k >= 1 && k <= probs.dim(1), what, ": probs must be [n, E] with k = ", k,
           " in [1, E], got ", shape_str(probs.shape()));
  const std::int64_t n = probs.dim(0);
  const int E = static_cast<int>(probs.dim(1));
  expect(probs, DType::f32, -1, what, "probs");
  expect(expert, DType::i32, n * k, what, "expert");
  expect(gate, DType::f32, n * k, what, "gate");
  expect(psum, DType::f64, E, what, "psum");
  if (bias.defined()) expect(bias, DType::f32, E, what, "bias");
  float* P = probs.data<float>();
  std::int32_t* ex = expert.data<std::int32_t>();
  float* g = gate.data<float>();
  double* mean_p = psum.data<double>();
  std::fill(mean_p, mean_p + E, 0.0);
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  std::vector<int> order(static_cast<std::size_t>(E));
  std::vector<float> score(static_cast<std::size_t>(E));
  for (std::int64_t t = 0; t < n; ++t) {
    float* pr = P + t * E;
    const float mx = *std::max_element(pr, pr + E);
    double z = 0;
    for (int e = 0; e < E; ++e) z += std::exp(double(pr[e]) - mx);
    for (int e = 0; e < E; ++e) {
      pr[e] = static_cast<float>(std::exp(double(pr[e]) - mx) / z);
      mean_p[e] += pr[e];
    }
    // Selection scores: p + b (aux-loss-free balancing); the gates use p alone.
    for (int e = 0; e < E; ++e) score[e] = b ? pr[e] + b[e] : pr[e];
    std::iota(order.begin(), order.end(), 0);  // ties: the lower expert index first
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int x, int y) { return score[x] > score[y] || (score[x] == score[y] && x < y); });
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += pr[order[j]];
    for (int j = 0; j < k; ++j) {
      ex[t * k + j] = order[j];
      g[t * k + j] = static_cast<float>(pr[order[j]] / sum);
    }
  }
}

void moe_gather_rows(const Tensor& src, const Tensor& idx, Tensor& dst) {
  const char* what = "moe_gather_rows";
  expect(idx, DType::i64, -1, what, "idx");
  expect(dst, DType::f32, -1, what, "dst");
  const std::int64_t m = idx.numel();
  if (m == 0) return;
  RT_CHECK(dst.numel() % m == 0, what, ": dst ", shape_str(dst.shape()), " is not ", m, " rows");
  const std::int64_t D = dst.numel() / m;
  const std::int64_t* ix = idx.data<std::int64_t>();
  float* d = dst.data<float>();
  const float* s = src.numel() > 0 ? (expect(src, DType::f32, -1, what, "src"), src.data<float>()) : nullptr;
  const std::int64_t src_rows = D > 0 ? src.numel() / D : 0;
  for (std::int64_t i = 0; i < m; ++i) {
    RT_CHECK(ix[i] < src_rows, what, ": index ", ix[i], " of row ", i, " is past src's ", src_rows, " rows");
    if (ix[i] < 0) std::fill(d + i * D, d + (i + 1) * D, 0.f);
    else std::memcpy(d + i * D, s + ix[i] * D, sizeof(float) * std::size_t(D));
  }
}

void moe_combine(const Tensor& rows, const Tensor& row, const Tensor& gate, int k, const Tensor& tokens, Tensor& y,
                 bool accumulate) {
  const char* what = "moe_combine";
  expect(y, DType::f32, -1, what, "y");
  const std::int64_t D = y.dim(-1), n = y.numel() / D;
  expect(row, DType::i64, n * k, what, "row");
  if (gate.defined()) expect(gate, DType::f32, n * k, what, "gate");
  if (tokens.defined()) expect(tokens, DType::i64, -1, what, "tokens");
  const std::int64_t* r = row.data<std::int64_t>();
  const float* g = gate.defined() ? gate.data<float>() : nullptr;
  const float* o = rows.numel() > 0 ? rows.data<float>() : nullptr;
  float* yp = y.data<float>();
  const std::int64_t count = tokens.defined() ? tokens.numel() : n;
  const std::int64_t* list = tokens.defined() ? tokens.data<std::int64_t>() : nullptr;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t t = list ? list[i] : i;
    float* yt = yp + t * D;
    if (!accumulate) std::fill(yt, yt + D, 0.f);
    for (std::int64_t a = t * k; a < (t + 1) * k; ++a) {
      if (r[a] < 0) continue;
      const float* od = o + r[a] * D;
      if (g) {
        const float ga = g[a];
        for (std::int64_t d = 0; d < D; ++d) yt[d] += ga * od[d];
      } else {
        for (std::int64_t d = 0; d < D; ++d) yt[d] += od[d];
      }
    }
  }
}

void moe_combine_backward(const Tensor& dy, const Tensor& rows, const Tensor& row, const Tensor& gate, int k,
                          Tensor& dgate, Tensor& drows) {
  const char* what = "moe_combine_backward";
  expect(dy, DType::f32, -1, what, "dy");
  const std::int64_t D = dy.dim(-1), n = dy.numel() / D;
  expect(row, DType::i64, n * k, what, "row");
  expect(gate, DType::f32, n * k, what, "gate");
  expect(dgate, DType::f32, n * k, what, "dgate");
  const std::int64_t* r = row.data<std::int64_t>();
  const float* g = gate.data<float>();
  const float* dyp = dy.data<float>();
  float* dg = dgate.data<float>();
  std::fill(dg, dg + n * k, 0.f);
  if (rows.numel() == 0) return;
  expect(drows, DType::f32, rows.numel(), what, "drows");
  const float* out = rows.data<float>();
  float* dout = drows.data<float>();
  for (std::int64_t a = 0; a < n * k; ++a) {
    if (r[a] < 0) continue;
    const float* o = out + r[a] * D;
    const float* d = dyp + (a / k) * D;
    float* dd = dout + r[a] * D;
    double dot = 0;
    for (std::int64_t j = 0; j < D; ++j) {
      dot += double(d[j]) * o[j];
      dd[j] = g[a] * d[j];
    }
    dg[a] = static_cast<float>(dot);
  }
}

void moe_router_backward(const Tensor& probs, const Tensor& expert, const Tensor& gate, const Tensor& dgate,
                         const Tensor& f, double aux_g, Tensor& dlogit) {
  const char* what = "moe_router_backward";
  expect(probs, DType::f32, -1, what, "probs");
  RT_CHECK(probs.ndim() == 2, what, ": probs must be [n, E], got ", shape_str(probs.shape()));
  const std::int64_t n = probs.dim(0);
  const int E = static_cast<int>(probs.dim(1));
  RT_CHECK(n > 0 || expert.numel() == 0, what, ": no tokens");
  const int k = n > 0 ? static_cast<int>(expert.numel() / n) : 1;
  expect(expert, DType::i32, n * k, what, "expert");
  expect(gate, DType::f32, n * k, what, "gate");
  expect(dgate, DType::f32, n * k, what, "dgate");
  expect(f, DType::f32, E, what, "f");
  expect(dlogit, DType::f32, n * E, what, "dlogit");
  const float* P = probs.data<float>();
  const std::int32_t* ex = expert.data<std::int32_t>();
  const float *g = gate.data<float>(), *dg = dgate.data<float>(), *fe = f.data<float>();
  float* dl = dlogit.data<float>();
  std::vector<double> dp(static_cast<std::size_t>(E));
  for (std::int64_t t = 0; t < n; ++t) {
    const float* pr = P + t * E;
    for (int e = 0; e < E; ++e) dp[e] = aux_g * fe[e];
    // Gates are p_j / sum of the token's top-k p (dropped assignments included: their gates exist, with no use).
    double sum = 0, gd = 0;
    for (int j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j;
      sum += pr[ex[a]];
      gd += double(g[a]) * dg[a];
    }
    for (int j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j;
      dp[ex[a]] += (dg[a] - gd) / sum;
    }
    double pdp = 0;
    for (int e = 0; e < E; ++e) pdp += double(pr[e]) * dp[e];
    for (int e = 0; e < E; ++e) dl[t * E + e] = static_cast<float>(pr[e] * (dp[e] - pdp));
  }
}

void batched_gemm(const Backend::BatchedGemm& g) {
  if (g.m == 0 || g.n == 0) return;
  for (std::int64_t b = 0; b < g.batch; ++b) {
    float* c = g.c + b * g.sc;
    if (g.k == 0) {  // BLAS leaves C * beta; be explicit
      for (std::int64_t i = 0; i < g.m; ++i)
        for (std::int64_t j = 0; j < g.n; ++j) c[i * g.ldc + j] = g.beta == 0 ? 0.f : c[i * g.ldc + j] * g.beta;
      continue;
    }
    cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, int(g.m), int(g.n),
                int(g.k), g.alpha, g.a + b * g.sa, int(g.lda), g.b + b * g.sb, int(g.ldb), g.beta, c, int(g.ldc));
  }
}

}  // namespace ringtrain::cpu
