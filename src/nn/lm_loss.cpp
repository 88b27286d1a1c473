// Vocabulary-parallel cross-entropy (nn/lm_loss.hpp).
#include "ringtrain/nn/lm_loss.hpp"

#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"

namespace ringtrain {

namespace {

// The logits' backend, after the checks every device shares.
Backend& backend_of(const Tensor& logits, const Tensor& labels, const char* what) {
  RT_CHECK(logits.defined() && logits.ndim() == 2 && logits.dtype() == DType::f32, what,
           ": logits must be float32 [rows, vocab / tensor]");
  RT_CHECK(labels.defined() && labels.dtype() == DType::i64 && labels.numel() == logits.dim(0), what,
           ": labels must be int64 [", logits.dim(0), "]");
  RT_CHECK(labels.device() == logits.device(), what, ": the labels are on ", labels.device().str(), ", the logits on ",
           logits.device().str());
  return backend_for(logits.device());
}

}  // namespace

// The local steps are Backend operations on the logits' device; the sums
// over the group between them are all-reduces of that device's buffers.
double vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& labels, const TensorGroup& g,
                                    Tensor& dlogits) {
  Backend& be = backend_of(logits, labels, "vocab-parallel cross-entropy");
  const std::int64_t rows = logits.dim(0);
  const Device dev = logits.device();
  // 1. The row maxima of the whole vocabulary: each rank's in its own column, summed (a max by sum).
  Tensor maxes = Tensor::empty({rows, std::int64_t(g.size)}, DType::f32, dev), none;
  be.vocab_row_max(logits, labels, g.rank, maxes, none);
  if (g.size > 1) tp_all_reduce(maxes, g);
  // 2. Per row: the sum of exp(x - max) over the vocabulary, and the target's logit (from its owner).
  Tensor sums = Tensor::empty({2, rows}, DType::f64, dev);
  be.vocab_xent_sums(logits, labels, g.rank, maxes, sums);
  if (g.size > 1) tp_all_reduce(sums, g);
  // 3. loss = mean(log z + max - target); d/dx = (softmax - onehot) / rows on this rank's columns.
  return be.vocab_xent_finish(logits, labels, g.rank, maxes, sums, dlogits);
}

std::int64_t vocab_parallel_count_correct(const Tensor& logits, const Tensor& labels, const TensorGroup& g) {
  Backend& be = backend_of(logits, labels, "vocab-parallel accuracy");
  const std::int64_t rows = logits.dim(0), first = std::int64_t(g.rank) * logits.dim(1);
  const Device dev = logits.device();
  // Each rank's row maxima in its own column (the others 0), summed: every rank sees all of them.
  Tensor maxes = Tensor::empty({rows, std::int64_t(g.size)}, DType::f32, dev), none;
  Tensor best = Tensor::empty({rows}, DType::i64, dev);
  be.vocab_row_max(logits, none, g.rank, maxes, best);
  if (g.size > 1) tp_all_reduce(maxes, g);
  // The whole row's first maximum (the unsplit argmax) is in the lowest rank holding the largest value.
  Tensor hits = Tensor::empty({1}, DType::f64, dev);
  be.vocab_count_hits(maxes, best, labels, g.rank, first, hits);
  if (g.size > 1) tp_all_reduce(hits, g);
  const Tensor host = dev.is_cpu() ? hits : hits.to(Device::cpu());
  return std::int64_t(host.data<double>()[0]);
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
