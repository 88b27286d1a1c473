// The token embedding's lookup and its adjoint on the CPU (Backend::embedding_forward/
// backward): TokenEmbedding's loops, in token order, so every run sums alike.
#include <cmath>

#include "cpu_backend.hpp"

namespace ringtrain::cpu {
namespace {

float ld(float v) { return v; }
float ld(bfloat16 v) { return to_f32(v); }
void st(float& d, float v) { d = v; }
void st(bfloat16& d, float v) { d = to_bf16(v); }

void check_host(const Tensor& t, DType dt, const char* what, const char* arg) {
  RT_CHECK(t.defined() && t.device().is_cpu() && t.dtype() == dt, "cpu backend: ", what, ": ", arg, " must be a ",
           dtype_name(dt), " CPU tensor");
}

}  // namespace

void embedding_forward(const Tensor& ids, std::int64_t vocab, std::int64_t first, const Tensor& weight,
                       const Tensor& pos, Tensor& rows, Tensor& y) {
  check_host(ids, DType::f32, "embedding forward", "ids");
  check_host(weight, DType::f32, "embedding forward", "weight");
  check_host(rows, DType::i32, "embedding forward", "rows");
  RT_CHECK(ids.ndim() == 2 && weight.ndim() == 2 && rows.numel() == ids.numel() &&
               y.numel() == ids.numel() * weight.dim(1) && (y.dtype() == DType::f32 || y.dtype() == DType::bf16),
           "embedding forward: ids ", shape_str(ids.shape()), ", weight ", shape_str(weight.shape()), ", rows ",
           shape_str(rows.shape()), ", y ", shape_str(y.shape()), " ", dtype_name(y.dtype()), " do not fit");
  const std::int64_t t = ids.dim(1), d = weight.dim(1), local = weight.dim(0), n = ids.numel();
  if (pos.defined()) {
    check_host(pos, DType::f32, "embedding forward", "pos");
    RT_CHECK(pos.dim(0) >= t && pos.dim(1) == d, "embedding forward: pos ", shape_str(pos.shape()), " for ", t,
             " tokens of width ", d);
  }
  const float* id = ids.data<float>();
  std::int32_t* row = rows.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = id[i];
    RT_CHECK(v >= 0 && v < float(vocab) && v == std::floor(v), "input ", i, " = ", v,
             " is not a token id in [0, ", vocab, ")");
    const std::int64_t r = std::int64_t(v) - first;
    row[i] = r >= 0 && r < local ? std::int32_t(r) : -1;
  }
  const float *w = weight.data<float>(), *p = pos.defined() ? pos.data<float>() : nullptr;
  auto run = [&](auto* out) {
    for (std::int64_t i = 0; i < n; ++i) {
      const float* wr = row[i] >= 0 ? w + std::int64_t(row[i]) * d : nullptr;
      const float* pr = p ? p + (i % t) * d : nullptr;
      auto* yr = out + i * d;
      if (wr && pr)
        for (std::int64_t k = 0; k < d; ++k) st(yr[k], wr[k] + pr[k]);
      else if (wr || pr)  // one term: copied, not added to a zero (which would turn -0 into +0)
        for (std::int64_t k = 0; k < d; ++k) st(yr[k], wr ? wr[k] : pr[k]);
      else
        for (std::int64_t k = 0; k < d; ++k) st(yr[k], 0.f);
    }
  };
  if (y.dtype() == DType::bf16) run(y.data<bfloat16>());
  else run(y.data<float>());
}

void embedding_backward(const Tensor& dy, const Tensor& rows, Tensor& dweight, Tensor& dpos) {
  check_host(rows, DType::i32, "embedding backward", "rows");
  check_host(dweight, DType::f32, "embedding backward", "dweight");
  RT_CHECK(dy.defined() && dy.device().is_cpu() && (dy.dtype() == DType::f32 || dy.dtype() == DType::bf16) &&
               dy.ndim() == 3 && dy.dim(0) * dy.dim(1) == rows.numel() && dweight.ndim() == 2 &&
               dweight.dim(1) == dy.dim(2),
           "embedding backward: dy ", shape_str(dy.shape()), ", rows ", shape_str(rows.shape()), ", dweight ",
           shape_str(dweight.shape()), " do not fit");
  const std::int64_t t = dy.dim(1), d = dy.dim(2), n = rows.numel();
  if (dpos.defined()) {
    check_host(dpos, DType::f32, "embedding backward", "dpos");
    RT_CHECK(dpos.dim(0) >= t && dpos.dim(1) == d, "embedding backward: dpos ", shape_str(dpos.shape()), " for ", t,
             " tokens of width ", d);
  }
  const std::int32_t* row = rows.data<std::int32_t>();
  float *dw = dweight.data<float>(), *dp = dpos.defined() ? dpos.data<float>() : nullptr;
  auto run = [&](const auto* g) {
    for (std::int64_t i = 0; i < n; ++i) {  // in order: the sums are the same on every run
      const auto* gr = g + i * d;
      if (dp)
        for (std::int64_t k = 0; k < d; ++k) dp[(i % t) * d + k] += ld(gr[k]);
      if (row[i] < 0) continue;
      float* wr = dw + std::int64_t(row[i]) * d;
      for (std::int64_t k = 0; k < d; ++k) wr[k] += ld(gr[k]);
    }
  };
  if (dy.dtype() == DType::bf16) run(dy.data<bfloat16>());
  else run(dy.data<float>());
}

}  // namespace ringtrain::cpu
