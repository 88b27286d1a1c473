#pragma once
// Loss and metric on the logits' device. Softmax cross-entropy is the mean
// over the batch; label smoothing s mixes the one-hot target with s/K.
#include <cstdint>

#include "ringtrain/core/tensor.hpp"

namespace ringtrain {

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
