#include "geometry.hpp"

#include <algorithm>
#include <cstddef>

#include "ringtrain/core/error.hpp"
#include "ringtrain/core/tensor.hpp"

namespace ringtrain::ckpt_detail {

PartGeometry PartGeometry::of(const PiecePlace& p) {
  PartGeometry g;
  if (!p.shard.sharded()) {
    g.numel = shape_numel(p.whole);
    g.run = g.numel;
    return g;
  }
  const auto d = static_cast<std::size_t>(p.shard.dim);
  std::int64_t outer = 1;
  for (std::size_t i = 0; i < d; ++i) outer *= p.whole[i];
  for (std::size_t i = d + 1; i < p.whole.size(); ++i) g.inner *= p.whole[i];
  g.G = p.whole[d];
  g.blocks = p.shard.blocks;
  const std::int64_t L = g.G / p.shard.parts, Lb = L / p.shard.blocks;
  g.block_stride = g.G / p.shard.blocks;
  g.index_offset = p.shard.index * Lb;
  g.run = Lb * g.inner;
  g.numel = outer * L * g.inner;
  return g;
}

bool same_part(const PiecePlace& a, const PiecePlace& b) {
  if (a.whole != b.whole || a.shard.sharded() != b.shard.sharded()) return false;
  return !a.shard.sharded() || (a.shard.dim == b.shard.dim && a.shard.parts == b.shard.parts &&
                                a.shard.index == b.shard.index && a.shard.blocks == b.shard.blocks);
}

std::string piece_where(const CheckpointIndex& ix, const StoredPiece& p) {
  return ix.head.parts.empty()
             ? cat("checkpoint '", ix.path, "' tensor '", p.name, "'")
             : cat("checkpoint '", ix.path, "': tensor '", p.name, "' in part file '",
                   ix.head.parts[static_cast<std::size_t>(p.file)], "'");
}

bool is_float(DType dt) { return dt == DType::f32 || dt == DType::f64 || dt == DType::f16 || dt == DType::bf16; }

namespace {
// Blocks of 4096 elements tested branch-free (an OR of the comparisons, which
// the compiler vectorises with SSE2's compares: a fixed trip count); a block
// that fails is scanned. A scan that stops at the first bad element does not
// vectorise, and this check reads every byte of a checkpoint.
template <typename U>
std::int64_t first_with_exponent(const U* p, std::int64_t n, U mask) {
  constexpr std::int64_t B = 4096;
  std::int64_t b = 0;
  for (; b + B <= n; b += B) {
    U any = 0;
    for (std::int64_t i = 0; i < B; ++i) any |= static_cast<U>((p[b + i] & mask) == mask);
    if (any) break;
  }
  for (std::int64_t i = b; i < n; ++i)
    if ((p[i] & mask) == mask) return i;
  return -1;
}
}  // namespace

std::int64_t first_non_finite(const void* data, std::int64_t n, DType dt) {
  switch (dt) {  // IEEE: Inf and NaN are the values whose exponent bits are all ones
    case DType::f32: return first_with_exponent(static_cast<const std::uint32_t*>(data), n, std::uint32_t{0x7f800000});
    case DType::f64:
      return first_with_exponent(static_cast<const std::uint64_t*>(data), n, std::uint64_t{0x7ff0000000000000});
    case DType::f16: return first_with_exponent(static_cast<const std::uint16_t*>(data), n, std::uint16_t{0x7c00});
    case DType::bf16: return first_with_exponent(static_cast<const std::uint16_t*>(data), n, std::uint16_t{0x7f80});
    default: return -1;
  }
}

}  // namespace ringtrain::ckpt_detail
