#include "geometry.hpp"

#include <cmath>
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
template <typename T>
std::int64_t first_non_finite_of(const T* p, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return i;
  return -1;
}
}  // namespace

std::int64_t first_non_finite(const void* data, std::int64_t n, DType dt) {
  switch (dt) {
    case DType::f32: return first_non_finite_of(static_cast<const float*>(data), n);
    case DType::f64: return first_non_finite_of(static_cast<const double*>(data), n);
    case DType::f16:
    case DType::bf16: {
      const std::uint16_t mask = dt == DType::f16 ? 0x7c00 : 0x7f80;  // exponent all ones: Inf or NaN
      const std::uint16_t* p = static_cast<const std::uint16_t*>(data);
      for (std::int64_t i = 0; i < n; ++i)
        if ((p[i] & mask) == mask) return i;
      return -1;
    }
    default: return -1;
  }
}

}  // namespace ringtrain::ckpt_detail
