// The vocabulary-parallel cross-entropy over the whole world as the tensor
// group equals softmax_cross_entropy on the gathered logits: the loss and this
// rank's columns of the gradient (float32, tolerance 10x the measured
// difference), with large logits (the shift by the global maximum matters)
// and labels owned by every rank; and the accuracy (the first argmax, ties
// across the slices included) equals count_correct on the gathered logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ringtrain/nn/lm_loss.hpp"
#include "ringtrain/nn/loss.hpp"

using namespace ringtrain;

TEST(VocabParallelLoss, EqualsTheGatheredLoss) {
  Communicator world = Communicator::world();
  const TensorGroup g = TensorGroup::of(world);
  const std::int64_t rows = 6, local = 5, vocab = local * g.size;
  Tensor whole = Tensor::empty({rows, vocab}), labels = Tensor::empty({rows}, DType::i64);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < vocab; ++j)  // every rank computes the same whole logits
      whole.data<float>()[r * vocab + j] = float(std::sin(double(r * 31 + j * 7)) * 30.0 + (r == 2 ? 80.0 : 0.0));
    labels.data<std::int64_t>()[r] = (r * 7 + 3) % vocab;
  }
  Tensor mine = Tensor::empty({rows, local});
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < local; ++j)
      mine.data<float>()[r * local + j] = whole.data<float>()[r * vocab + g.rank * local + j];
  Tensor d = Tensor::empty({rows, local});
  const double loss = vocab_parallel_cross_entropy(mine, labels, g, d);
  const LossResult ref = softmax_cross_entropy(whole, labels);
  EXPECT_NEAR(loss, ref.loss, 5e-9 * std::fabs(ref.loss));  // <= 4e-10 relative measured at 1-4 ranks
  double worst = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < local; ++j) {
      const double a = d.data<float>()[r * local + j], b = ref.dlogits.data<float>()[r * vocab + g.rank * local + j];
      worst = std::max(worst, std::fabs(a - b));
      EXPECT_NEAR(a, b, 2e-7) << "row " << r << " column " << g.rank * local + j;  // <= 1.5e-8 measured
    }
  if (world.rank() == 0) std::printf("[vocab-parallel loss] %d ranks: loss %.9f vs %.9f, worst dlogit diff %.1e\n",
                                     g.size, loss, ref.loss, worst);
}

// The accuracy over vocabulary slices equals count_correct on the gathered
// logits, ties included: values from {0, 1, 2} repeat across the slices, and
// labels name the first maximum, a later maximum or a non-maximum of each row.
TEST(VocabParallelLoss, AccuracyIsTheGatheredFirstArgmax) {
  Communicator world = Communicator::world();
  const TensorGroup g = TensorGroup::of(world);
  const std::int64_t rows = 24, local = 3, vocab = local * g.size;
  Tensor whole = Tensor::empty({rows, vocab}), labels = Tensor::empty({rows}, DType::i64);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < vocab; ++j) whole.data<float>()[r * vocab + j] = float((r * 5 + j * (r % 4)) % 3);
    const float* row = whole.data<float>() + r * vocab;
    const std::int64_t first = std::max_element(row, row + vocab) - row;
    std::int64_t last = first;
    for (std::int64_t j = 0; j < vocab; ++j)
      if (row[j] == row[first]) last = j;
    labels.data<std::int64_t>()[r] = r % 3 == 0 ? first : r % 3 == 1 ? last : (first + 1) % vocab;
  }
  Tensor mine = Tensor::empty({rows, local});
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < local; ++j)
      mine.data<float>()[r * local + j] = whole.data<float>()[r * vocab + g.rank * local + j];
  const std::int64_t ref = count_correct(whole, labels);
  EXPECT_EQ(vocab_parallel_count_correct(mine, labels, g), ref);
  EXPECT_GE(ref, rows / 3);  // the first-maximum labels at least
}
