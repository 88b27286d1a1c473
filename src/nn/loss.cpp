#include "ringtrain/nn/loss.hpp"

#include "ringtrain/nn/backend.hpp"

namespace ringtrain {
namespace {

// Per-token logits [N, T, K] with labels [N, T] are N*T rows of a [N*T, K] problem.
Tensor rows(const Tensor& t, std::int64_t features) {
  if (!t.defined()) return t;
  return features > 0 ? t.reshape({t.numel() / features, features}) : t.reshape({t.numel()});
}
bool per_token(const Tensor& logits, const Tensor& labels) {
  if (!logits.defined() || !labels.defined() || logits.ndim() != 3 || labels.ndim() != 2) return false;
  return logits.dim(0) == labels.dim(0) && logits.dim(1) == labels.dim(1);
}

void check(const Tensor& logits, const Tensor& labels) {
  RT_CHECK(logits.defined() && logits.ndim() == 2 && logits.dim(0) > 0 && logits.dim(1) > 0,
           "softmax cross-entropy: logits must be [N, K], got ",
           logits.defined() ? shape_str(logits.shape()) : std::string("undefined"));
  RT_CHECK(logits.dtype() == DType::f32, "softmax cross-entropy: logits must be float32, got ",
           dtype_name(logits.dtype()));
  RT_CHECK(labels.defined() && labels.ndim() == 1 && labels.dim(0) == logits.dim(0),
           "softmax cross-entropy: labels must be [", logits.dim(0), "], got ",
           labels.defined() ? shape_str(labels.shape()) : std::string("undefined"));
  RT_CHECK(labels.dtype() == DType::i32 || labels.dtype() == DType::i64,
           "softmax cross-entropy: labels must be int32 or int64, got ", dtype_name(labels.dtype()));
  RT_CHECK(labels.device() == logits.device(), "softmax cross-entropy: labels on ", labels.device().str(),
           " but logits on ", logits.device().str());
}

}  // namespace

double softmax_cross_entropy(const Tensor& logits_in, const Tensor& labels_in, double smoothing, Tensor& dlogits) {
  if (per_token(logits_in, labels_in)) {
    Tensor d = dlogits.defined() && dlogits.shape() == logits_in.shape() ? rows(dlogits, logits_in.dim(2)) : dlogits;
    return softmax_cross_entropy(rows(logits_in, logits_in.dim(2)), rows(labels_in, 0), smoothing, d);
  }
  const Tensor& logits = logits_in;
  const Tensor& labels = labels_in;
  check(logits, labels);
  RT_CHECK(smoothing >= 0 && smoothing < 1, "label smoothing must be in [0, 1), got ", smoothing);
  if (dlogits.defined())
    RT_CHECK(dlogits.shape() == logits.shape() && dlogits.dtype() == logits.dtype() &&
                 dlogits.device() == logits.device(),
             "softmax cross-entropy: dlogits must match the logits ", shape_str(logits.shape()));
  return backend_for(logits.device()).softmax_xent(logits, labels, smoothing, dlogits);
}

LossResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels, double smoothing) {
  LossResult r;
  r.dlogits = Tensor::empty(logits.defined() ? logits.shape() : Shape{0}, DType::f32, logits.device());
  r.loss = softmax_cross_entropy(logits, labels, smoothing, r.dlogits);
  return r;
}

double softmax_cross_entropy_loss(const Tensor& logits, const Tensor& labels, double smoothing) {
  Tensor none;
  return softmax_cross_entropy(logits, labels, smoothing, none);
}

std::int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  if (per_token(logits, labels)) return count_correct(rows(logits, logits.dim(2)), rows(labels, 0));
  check(logits, labels);
  return backend_for(logits.device()).count_correct(logits, labels);
}

double top1_accuracy(const Tensor& logits, const Tensor& labels) {
  return double(count_correct(logits, labels)) / double(logits.dim(0));
}

namespace {

class CrossEntropy final : public Loss {
 public:
  explicit CrossEntropy(double smoothing) : smoothing_(smoothing) {}
  std::string name() const override { return "cross-entropy"; }
  double value_and_grad(const Tensor& out, const Tensor& targets, Tensor& grad) const override {
    return grad.defined() ? softmax_cross_entropy(out, targets, smoothing_, grad)
                          : softmax_cross_entropy_loss(out, targets, smoothing_);
  }
  std::int64_t correct(const Tensor& out, const Tensor& targets) const override { return count_correct(out, targets); }

 private:
  double smoothing_;
};

}  // namespace

LossPtr cross_entropy_loss(double label_smoothing) { return std::make_shared<CrossEntropy>(label_smoothing); }

}  // namespace ringtrain
