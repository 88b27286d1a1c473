// The vocabulary-parallel cross-entropy and accuracy's local steps on the CPU
// (Backend::vocab_row_max, vocab_xent_sums, vocab_xent_finish,
// vocab_count_hits; nn/lm_loss.cpp sums their outputs over the tensor group
// between the calls). Each row's loops run in column order and the loss sums
// the rows in order, so every run gives the same bits.
#include <algorithm>
#include <cmath>

#include "cpu_backend.hpp"

namespace ringtrain::cpu {
namespace {

struct Slice {
  const float* x;
  std::int64_t rows, local, parts, first;
};

Slice slice_of(const Tensor& logits, const Tensor& maxes, int part, const char* what) {
  RT_CHECK(logits.defined() && logits.device().is_cpu() && logits.dtype() == DType::f32 && logits.ndim() == 2, what,
           ": logits must be a float32 [rows, vocab / tensor] CPU tensor");
  const std::int64_t rows = logits.dim(0), local = logits.dim(1);
  RT_CHECK(maxes.defined() && maxes.device().is_cpu() && maxes.dtype() == DType::f32 && maxes.ndim() == 2 &&
               maxes.dim(0) == rows && part >= 0 && part < maxes.dim(1),
           what, ": maxes must be float32 [", rows, ", parts] with part ", part, " among the parts, got ",
           shape_str(maxes.shape()));
  return {logits.data<float>(), rows, local, maxes.dim(1), std::int64_t(part) * local};
}

const std::int64_t* labels_of(const Tensor& labels, std::int64_t rows, const char* what) {
  RT_CHECK(labels.defined() && labels.device().is_cpu() && labels.dtype() == DType::i64 && labels.numel() == rows,
           what, ": labels must be int64 [", rows, "] on the CPU");
  return labels.data<std::int64_t>();
}

// The largest of row r's summed maxima: the whole vocabulary's maximum.
float row_max(const float* maxes, std::int64_t r, std::int64_t parts) {
  float m = -INFINITY;
  for (std::int64_t k = 0; k < parts; ++k) m = std::max(m, maxes[r * parts + k]);
  return m;
}

}  // namespace

void vocab_row_max(const Tensor& logits, const Tensor& labels, int part, Tensor& maxes, Tensor& best) {
  const char* what = "vocab-parallel cross-entropy";
  const Slice s = slice_of(logits, maxes, part, what);
  const std::int64_t* y = labels.defined() ? labels_of(labels, s.rows, what) : nullptr;
  std::int64_t* b = nullptr;
  if (best.defined()) {
    RT_CHECK(best.device().is_cpu() && best.dtype() == DType::i64 && best.numel() == s.rows, what,
             ": best must be int64 [", s.rows, "] on the CPU");
    b = best.data<std::int64_t>();
  }
  float* m = maxes.data<float>();
  std::fill(m, m + s.rows * s.parts, 0.f);
  for (std::int64_t r = 0; r < s.rows; ++r) {
    if (y)
      RT_CHECK(y[r] >= 0 && y[r] < s.parts * s.local, what, ": label ", y[r], " of row ", r, " is not in [0, ",
               s.parts * s.local, ")");
    const float* xr = s.x + r * s.local;
    const std::int64_t at = std::max_element(xr, xr + s.local) - xr;  // this slice's first maximum
    m[r * s.parts + part] = xr[at];
    if (b) b[r] = at;
  }
}

void vocab_xent_sums(const Tensor& logits, const Tensor& labels, int part, const Tensor& maxes, Tensor& sums) {
  const char* what = "vocab-parallel cross-entropy";
  const Slice s = slice_of(logits, maxes, part, what);
  const std::int64_t* y = labels_of(labels, s.rows, what);
  RT_CHECK(sums.device().is_cpu() && sums.dtype() == DType::f64 && sums.numel() == 2 * s.rows, what,
           ": sums must be float64 [2, ", s.rows, "] on the CPU");
  const float* mx = maxes.data<float>();
  double *z = sums.data<double>(), *target = z + s.rows;
  // In double, as the unsplit loss sums them.
  for (std::int64_t r = 0; r < s.rows; ++r) {
    const float m = row_max(mx, r, s.parts);
    double acc = 0;
    for (std::int64_t j = 0; j < s.local; ++j) acc += std::exp(double(s.x[r * s.local + j]) - m);
    z[r] = acc;
    target[r] = y[r] >= s.first && y[r] < s.first + s.local ? s.x[r * s.local + (y[r] - s.first)] : 0.0;
  }
}

double vocab_xent_finish(const Tensor& logits, const Tensor& labels, int part, const Tensor& maxes,
                         const Tensor& sums, Tensor& dlogits) {
  const char* what = "vocab-parallel cross-entropy";
  const Slice s = slice_of(logits, maxes, part, what);
  const std::int64_t* y = labels_of(labels, s.rows, what);
  RT_CHECK(sums.device().is_cpu() && sums.dtype() == DType::f64 && sums.numel() == 2 * s.rows, what,
           ": sums must be float64 [2, ", s.rows, "] on the CPU");
  const float* mx = maxes.data<float>();
  const double *z = sums.data<double>(), *target = z + s.rows;
  // loss = mean(log z + max - target); d/dx = (softmax - onehot) / rows on this rank's columns.
  double loss = 0;
  for (std::int64_t r = 0; r < s.rows; ++r) loss += std::log(z[r]) + row_max(mx, r, s.parts) - target[r];
  if (dlogits.defined()) {
    RT_CHECK(dlogits.device().is_cpu() && dlogits.shape() == logits.shape() && dlogits.dtype() == DType::f32, what,
             ": dlogits must match the logits ", shape_str(logits.shape()));
    float* d = dlogits.data<float>();
    for (std::int64_t r = 0; r < s.rows; ++r) {
      const float m = row_max(mx, r, s.parts);
      for (std::int64_t j = 0; j < s.local; ++j) {
        const double p = std::exp(double(s.x[r * s.local + j]) - m) / z[r];
        d[r * s.local + j] = float((p - (s.first + j == y[r] ? 1.0 : 0.0)) / double(s.rows));
      }
    }
  }
  return loss / double(s.rows);
}

void vocab_count_hits(const Tensor& maxes, const Tensor& best, const Tensor& labels, int part, std::int64_t first,
                      Tensor& hits) {
  const char* what = "vocab-parallel accuracy";
  RT_CHECK(maxes.defined() && maxes.device().is_cpu() && maxes.dtype() == DType::f32 && maxes.ndim() == 2 &&
               part >= 0 && part < maxes.dim(1),
           what, ": maxes must be float32 [rows, parts] on the CPU with part ", part, " among the parts");
  const std::int64_t rows = maxes.dim(0), parts = maxes.dim(1);
  const std::int64_t* y = labels_of(labels, rows, what);
  RT_CHECK(best.defined() && best.device().is_cpu() && best.dtype() == DType::i64 && best.numel() == rows, what,
           ": best must be int64 [", rows, "] on the CPU");
  RT_CHECK(hits.defined() && hits.device().is_cpu() && hits.dtype() == DType::f64 && hits.numel() == 1, what,
           ": hits must be one float64 on the CPU");
  const std::int64_t* b = best.data<std::int64_t>();
  double n = 0;
  // The whole row's first maximum (the unsplit argmax) is in the lowest part holding the largest value.
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* mr = maxes.data<float>() + r * parts;
    const std::int64_t owner = std::max_element(mr, mr + parts) - mr;
    if (owner == part && first + b[r] == y[r]) n += 1;
  }
  hits.data<double>()[0] = n;
}

}  // namespace ringtrain::cpu
