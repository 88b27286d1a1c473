#pragma once
// The routing statistics of MoeMlp (nn/moe.hpp), internal to src/nn: what the
// aux loss, the capacity, the bias update and the metrics need of a whole
// micro-batch when each tensor rank routes its own token shard (sequence
// parallelism), summed over the tensor group in one small all-gather.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ringtrain/nn/tensor_group.hpp"

namespace ringtrain::detail {

struct RoutingTotals {
  std::vector<double> count;  // [E] assignments per expert (before capacity), whole micro-batch
  std::vector<double> prob;   // [E] router probabilities summed over its tokens
  double tokens = 0;          // its tokens
  // [rows, E] assignments to expert e that precede row r of this rank's tokens
  // in the whole micro-batch's token order (sample-major; within a sample,
  // tensor rank 0's shard first): what the capacity counts against.
  std::vector<double> before;
};

// local: [rows, E] this rank's assignments per row (a row is one sample's
// tokens here; rows = 1 when no capacity needs the order) followed by [E]
// probability sums; tokens: this rank's. Over g (each rank holding tokens
// [r T/g.size, (r+1) T/g.size) of every sample, as seq_slice cuts them); g of
// size 1: this rank's tokens are the whole micro-batch.
RoutingTotals routing_totals(const std::vector<double>& local, int rows, int experts, std::int64_t tokens,
                             const TensorGroup& g);

}  // namespace ringtrain::detail
