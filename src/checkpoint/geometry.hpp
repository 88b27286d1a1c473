#pragma once
// Geometry of stored pieces, shared by the index (tiling checks) and the
// sharded reader (which ranges of which pieces a target needs).
//
// A tensor-parallel part of a whole tensor (ShardSpec: `parts` parts along
// `dim`, each of `blocks` equal blocks) is, in the whole tensor's row-major
// order, a sequence of equal runs of consecutive elements at increasing
// offsets: run k = o·blocks + b (o over the dimensions before `dim`, b over
// the blocks) holds local elements [k·run, (k+1)·run) and starts at whole
// element (o·G + b·G/blocks + index·L/blocks)·inner. A replicated tensor is
// one run. Two such ranges therefore intersect in a merge of two sorted run
// lists, without materialising either.
#include <algorithm>
#include <cstdint>
#include <string>

#include "ringtrain/core/dtype.hpp"
#include "ringtrain/nn/parameters.hpp"
#include "ringtrain/checkpoint/read.hpp"

namespace ringtrain::ckpt_detail {

struct PartGeometry {
  std::int64_t numel = 0;  // elements of the part
  std::int64_t run = 0;    // elements per run
  std::int64_t blocks = 1, G = 1, inner = 1, block_stride = 0, index_offset = 0;

  static PartGeometry of(const PiecePlace& p);
  std::int64_t run_start(std::int64_t k) const {  // whole element where run k starts
    const std::int64_t o = k / blocks, b = k % blocks;
    return (o * G + b * block_stride + index_offset) * inner;
  }
  std::int64_t to_whole(std::int64_t local) const {
    return run ? run_start(local / run) + local % run : local;
  }
};

bool same_part(const PiecePlace& a, const PiecePlace& b);  // the same whole shape, split and part

// Calls f(a_off, b_off, n) for each stretch of n elements that range
// [a0, a0 + an) of part `A` and range [b0, b0 + bn) of part `B` (of the same
// whole tensor) share; offsets are relative to a0 and b0, ascending.
template <typename F>
void for_each_overlap(const PartGeometry& A, std::int64_t a0, std::int64_t an, const PartGeometry& B,
                      std::int64_t b0, std::int64_t bn, F&& f) {
  if (an <= 0 || bn <= 0) return;
  std::int64_t ka = a0 / A.run, kb = b0 / B.run;
  const std::int64_t a_end = a0 + an, b_end = b0 + bn;
  while (ka * A.run < a_end && kb * B.run < b_end) {
    const std::int64_t la = std::max(a0, ka * A.run), ha = std::min(a_end, (ka + 1) * A.run);
    const std::int64_t lb = std::max(b0, kb * B.run), hb = std::min(b_end, (kb + 1) * B.run);
    const std::int64_t wa = A.run_start(ka) + (la - ka * A.run), wb = B.run_start(kb) + (lb - kb * B.run);
    const std::int64_t wa_end = wa + (ha - la), wb_end = wb + (hb - lb);
    const std::int64_t lo = std::max(wa, wb), hi = std::min(wa_end, wb_end);
    if (lo < hi) f(la + (lo - wa) - a0, lb + (lo - wb) - b0, hi - lo);
    if (wa_end <= wb_end) ++ka;
    else ++kb;
  }
}

// "checkpoint 'X': tensor 'T' in part file 'P'" (one file: "checkpoint 'X' tensor 'T'").
std::string piece_where(const CheckpointIndex& ix, const StoredPiece& p);

// One file's index as stored (a part file alone, or a manifest without its
// parts' pieces), its pieces unchecked for tiling: read_checkpoint_file.
CheckpointIndex index_file_as_stored(const std::string& path);

bool is_float(DType dt);
// Index of the first NaN or Inf among n elements of dtype dt, or -1.
std::int64_t first_non_finite(const void* data, std::int64_t n, DType dt);

}  // namespace ringtrain::ckpt_detail
