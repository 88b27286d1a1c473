#pragma once
// The experts' GEMMs of MoeMlp (nn/moe.hpp), internal to src/nn. Expert l's
// rows sit in a block of `stride` rows (rows [l*stride, l*stride + rows[l]));
// the rest of the block is padding. One call covers every local expert:
//  - blas_loop: one OpenBLAS sgemm per expert on its rows alone;
//  - dnnl_grouped: one oneDNN matmul with the experts as its batch dimension,
//    every expert taking `stride` rows (the padding computed as well: where the
//    rows are the reduction dimension, the caller keeps pad rows at zero, so
//    they add nothing). oneDNN has no grouped GEMM of unequal sizes, so padding
//    to the busiest expert is the price of the one call.
//  - dnnl_loop: one oneDNN matmul per expert on its rows alone (a primitive per size).
// bench/nn_moe_layer.cpp measures the three against the dense MLP.
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "ringtrain/nn/moe.hpp"

namespace ringtrain::detail {

// C_l = alpha op(A_l) op(B_l) (+ C_l when accumulate), l < groups. Row-major
// operands; each given by its first group's pointer, its leading dimension and
// the elements between groups. m, n, k: the padded per-group sizes; the rows
// of each group (rows[l] <= stride) replace m (rows_are_k = false: the output's
// rows vary) or k (true: a weight gradient, summing over the rows).
struct GroupedGemm {
  bool ta = false, tb = false;
  std::int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  std::int64_t lda = 0, sa = 0;
  const float* b = nullptr;
  std::int64_t ldb = 0, sb = 0;
  float* c = nullptr;
  std::int64_t ldc = 0, sc = 0;
  float alpha = 1;
  bool accumulate = false;
};

class ExpertGemm {
 public:
  explicit ExpertGemm(ExpertGemmMode mode);
  ~ExpertGemm();
  ExpertGemmMode mode() const { return mode_; }
  void run(const GroupedGemm& g, const std::vector<std::int64_t>& rows, bool rows_are_k);
  // Group l's rows [first[l], first[l] + rows[l]) of its block only (the rows
  // are m, op(A) untransposed: the overlap's own-rank and remote rows in turn,
  // src/nn/moe_dispatch.hpp). The loop modes only: dnnl_grouped computes whole blocks.
  void run_rows(const GroupedGemm& g, const std::vector<std::int64_t>& first, const std::vector<std::int64_t>& rows);

 private:
  struct Impl;
  ExpertGemmMode mode_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringtrain::detail
