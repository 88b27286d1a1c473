#pragma once
// Loss and metric on the logits' device. Softmax cross-entropy is the mean
// over the batch; label smoothing s mixes the one-hot target with s/K.
#include <cstdint>
#include <memory>
#include <string>

#include "ringtrain/core/tensor.hpp"

namespace ringtrain {

// The loss a training schedule applies to the model's output. The pipeline
// executor takes one as an argument (parallel/executor.hpp) and knows nothing
// of the model that made the output. Built in: softmax cross-entropy (below)
// and its vocabulary-parallel form (nn/lm_loss.hpp, chosen by a split LM
// head); a registered model may bring its own (nn/model_registry.hpp).
// Implementations are stateless: one object serves every micro-batch.
class Loss {
 public:
  virtual ~Loss() = default;
  virtual std::string name() const = 0;
  // The mean loss over the targets' elements (samples, or a language model's
  // tokens). When `grad` is defined it receives d mean-loss / d output: the
  // output's shape and device (the executor reuses it across steps).
  virtual double value_and_grad(const Tensor& output, const Tensor& targets, Tensor& grad) const = 0;
  // How many targets the output predicts correctly (accuracy's numerator);
  // 0 where the notion does not apply.
  virtual std::int64_t correct(const Tensor& output, const Tensor& targets) const { return 0; }
  // True when the output is split over a tensor group and every rank of it
  // takes part in value_and_grad and correct (collectives); false when the
  // group's ranks hold the same output and tensor rank 0 counts for them.
  virtual bool collective() const { return false; }
};
using LossPtr = std::shared_ptr<const Loss>;

// Softmax cross-entropy with label smoothing (the functions below) and top-1 counts.
LossPtr cross_entropy_loss(double label_smoothing = 0.0);

struct LossResult {
  double loss = 0;  // mean over the batch
  Tensor dlogits;   // d loss / d logits, same shape and device as the logits
};

// logits [N,K] (f32), labels [N] (i32 or i64, each in [0,K)); per-token
// logits [N,T,K] with labels [N,T] are the N*T rows (the mean over tokens;
// count_correct counts tokens). Throws Error
// naming the mismatch on wrong shapes, dtypes, devices or labels.
LossResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing = 0.0);
// Same, writing into a caller-owned dlogits (reused across steps, no allocation).
double softmax_cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing, Tensor& dlogits);
// Loss only.
double softmax_cross_entropy_loss(const Tensor& logits, const Tensor& labels, double label_smoothing = 0.0);

// Top-1: number of rows whose first maximum is the label, and the fraction.
std::int64_t count_correct(const Tensor& logits, const Tensor& labels);
double top1_accuracy(const Tensor& logits, const Tensor& labels);

}  // namespace ringtrain
