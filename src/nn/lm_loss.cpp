// Vocabulary-parallel cross-entropy (nn/lm_loss.hpp).
#include "ringtrain/nn/lm_loss.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ringtrain/nn/tensor_parallel.hpp"

namespace ringtrain {

double vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& labels, const TensorGroup& g,
                                    Tensor& dlogits) {
  RT_CHECK(logits.defined() && logits.ndim() == 2 && logits.dtype() == DType::f32 && logits.device().is_cpu(),
           "vocab-parallel cross-entropy: logits must be float32 [rows, vocab / tensor] on the CPU");
  const std::int64_t rows = logits.dim(0), local = logits.dim(1), first = std::int64_t(g.rank) * local;
  const std::int64_t vocab = local * g.size;
  RT_CHECK(labels.defined() && labels.dtype() == DType::i64 && labels.numel() == rows,
           "vocab-parallel cross-entropy: labels must be int64 [", rows, "]");
  const float* x = logits.data<float>();
  const std::int64_t* y = labels.data<std::int64_t>();
  // 1. The row maxima of the whole vocabulary: each rank's in its own column, summed (a max by sum).
  Tensor maxes = Tensor::zeros({rows, std::int64_t(g.size)});
  for (std::int64_t r = 0; r < rows; ++r) {
    RT_CHECK(y[r] >= 0 && y[r] < vocab, "vocab-parallel cross-entropy: label ", y[r], " of row ", r,
             " is not in [0, ", vocab, ")");
    maxes.data<float>()[r * g.size + g.rank] = *std::max_element(x + r * local, x + (r + 1) * local);
  }
  if (g.size > 1) tp_all_reduce(maxes, g);
  std::vector<float> m(std::size_t(rows), -INFINITY);
  for (std::int64_t r = 0; r < rows; ++r)
    for (int k = 0; k < g.size; ++k) m[std::size_t(r)] = std::max(m[std::size_t(r)], maxes.data<float>()[r * g.size + k]);
  // 2. Per row: the sum of exp(x - max) over the vocabulary, and the target's logit (from its owner);
  // in double, as the unsplit loss sums them.
  Tensor sums = Tensor::zeros({2, rows}, DType::f64);
  double *z = sums.data<double>(), *target = z + rows;
  for (std::int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (std::int64_t j = 0; j < local; ++j) s += std::exp(double(x[r * local + j]) - m[std::size_t(r)]);
    z[r] = s;
    if (y[r] >= first && y[r] < first + local) target[r] = x[r * local + (y[r] - first)];
  }
  if (g.size > 1) tp_all_reduce(sums, g);
  // 3. loss = mean(log z + max - target); d/dx = (softmax - onehot) / rows on this rank's columns.
  double loss = 0;
  for (std::int64_t r = 0; r < rows; ++r) loss += std::log(z[r]) + m[std::size_t(r)] - target[r];
  if (dlogits.defined()) {
    RT_CHECK(dlogits.shape() == logits.shape() && dlogits.dtype() == DType::f32,
             "vocab-parallel cross-entropy: dlogits must match the logits ", shape_str(logits.shape()));
    float* d = dlogits.data<float>();
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < local; ++j) {
        const double p = std::exp(double(x[r * local + j]) - m[std::size_t(r)]) / z[r];
        d[r * local + j] = float((p - (first + j == y[r] ? 1.0 : 0.0)) / double(rows));
      }
  }
  return loss / double(rows);
}

std::int64_t vocab_parallel_count_correct(const Tensor& logits, const Tensor& labels, const TensorGroup& g) {
  RT_CHECK(logits.defined() && logits.ndim() == 2 && logits.dtype() == DType::f32 && logits.device().is_cpu(),
           "vocab-parallel accuracy: logits must be float32 [rows, vocab / tensor] on the CPU");
  const std::int64_t rows = logits.dim(0), local = logits.dim(1), first = std::int64_t(g.rank) * local;
  RT_CHECK(labels.defined() && labels.dtype() == DType::i64 && labels.numel() == rows,
           "vocab-parallel accuracy: labels must be int64 [", rows, "]");
  const float* x = logits.data<float>();
  const std::int64_t* y = labels.data<std::int64_t>();
  // Each rank's row maxima in its own column (the others 0), summed: every rank sees all of them.
  Tensor maxes = Tensor::zeros({rows, std::int64_t(g.size)});
  std::vector<std::int64_t> best(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * local;
    best[std::size_t(r)] = std::max_element(xr, xr + local) - xr;  // this slice's first maximum
    maxes.data<float>()[r * g.size + g.rank] = xr[best[std::size_t(r)]];
  }
  if (g.size > 1) tp_all_reduce(maxes, g);
  // The whole row's first maximum (the unsplit argmax) is in the lowest rank holding the largest value.
  Tensor hits = Tensor::zeros({1}, DType::f64);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* mr = maxes.data<float>() + r * g.size;
    const int owner = int(std::max_element(mr, mr + g.size) - mr);
    if (owner == g.rank && first + best[std::size_t(r)] == y[r]) hits.data<double>()[0] += 1;
  }
  if (g.size > 1) tp_all_reduce(hits, g);
  return std::int64_t(hits.data<double>()[0]);
}

namespace {

// [..., K] as rows [n, K] (labels [...] as [n]).
Tensor as_rows(const Tensor& t, std::int64_t k) {
  return t.defined() ? (k > 0 ? t.reshape({t.numel() / k, k}) : t.reshape({t.numel()})) : t;
}

class VocabParallelCrossEntropy final : public Loss {
 public:
  explicit VocabParallelCrossEntropy(TensorGroup g) : g_(std::move(g)) {}
  std::string name() const override { return "vocab-parallel cross-entropy"; }
  double value_and_grad(const Tensor& out, const Tensor& targets, Tensor& grad) const override {
    const std::int64_t k = out.dim(out.ndim() - 1);
    Tensor d = as_rows(grad, k);
    return vocab_parallel_cross_entropy(as_rows(out, k), as_rows(targets, 0), g_, d);
  }
  std::int64_t correct(const Tensor& out, const Tensor& targets) const override {
    return vocab_parallel_count_correct(as_rows(out, out.dim(out.ndim() - 1)), as_rows(targets, 0), g_);
  }
  bool collective() const override { return true; }

 private:
  TensorGroup g_;
};

}  // namespace

LossPtr vocab_parallel_cross_entropy_loss(const TensorGroup& g) {
  return std::make_shared<VocabParallelCrossEntropy>(g);
}

}  // namespace ringtrain
