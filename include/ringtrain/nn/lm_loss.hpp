#pragma once
// Vocabulary-parallel softmax cross-entropy (Megatron-LM's): each tensor rank
// holds the logits of its slice of the vocabulary, [rows, vocab / T] (the
// columns [rank * V/T, (rank + 1) * V/T)), and the loss is computed without
// gathering them: the row maxima, the sums of exponentials and the target
// logits are summed over the group (3 small all-reduces of O(rows) values),
// so no rank ever holds [rows, vocab]. Equal to softmax_cross_entropy on the
// gathered logits (mean over the rows); dlogits is this rank's slice of its
// gradient. The gpt model's vocabulary-parallel head (nn/language.hpp) gives
// such logits; the pipeline executor computes its loss and accuracy here.
#include "ringtrain/core/tensor.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/nn/tensor_group.hpp"

namespace ringtrain {

// logits f32 [rows, V/T] (CPU), labels i64 [rows] in [0, V); dlogits (when
// defined) f32 [rows, V/T] receives d mean-loss / d logits. Collective over g.
double vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& labels, const TensorGroup& g, Tensor& dlogits);

// The number of rows whose whole-vocabulary argmax (the first maximum, as
// count_correct) is the label, summed over the group (the same on every rank).
// Two all-reduces of O(rows) values. Collective over g.
std::int64_t vocab_parallel_count_correct(const Tensor& logits, const Tensor& labels, const TensorGroup& g);

// Both as a Loss (collective over g): logits [..., V/T] with labels [...] are
// taken as rows. What a vocabulary-parallel LM head asks for (Layer::output_loss).
LossPtr vocab_parallel_cross_entropy_loss(const TensorGroup& g);

}  // namespace ringtrain
