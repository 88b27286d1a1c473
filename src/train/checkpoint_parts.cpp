// A parallel checkpoint's whole tensors from its part files. Each piece is a
// row-major range of one tensor-parallel part of a tensor (or of the whole
// tensor when it is replicated); the parts are filled piece by piece, checked
// to be covered exactly, and placed into the whole tensor.
#include "checkpoint_parts.hpp"

#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"

namespace fs = std::filesystem;

namespace ringtrain {
namespace {

struct Assembly {
  DType dtype = DType::f32;
  PiecePlace place;                  // begin unused: the tensor's split
  std::vector<Tensor> parts;         // per tensor-parallel part (one when replicated)
  std::vector<std::int64_t> filled;  // elements written into each
  int count() const { return place.shard.sharded() ? place.shard.parts : 1; }
  Shape part_shape() const {
    Shape s = place.whole;
    if (place.shard.sharded()) s[static_cast<std::size_t>(place.shard.dim)] /= place.shard.parts;
    return s;
  }
};

bool same_split(const PiecePlace& a, const PiecePlace& b) {
  return a.whole == b.whole && a.shard.dim == b.shard.dim && a.shard.parts == b.shard.parts &&
         a.shard.blocks == b.shard.blocks;
}

std::string split_str(const PiecePlace& p) {
  return p.shard.sharded() ? cat(shape_str(p.whole), " split in ", p.shard.parts, " along dimension ", p.shard.dim)
                           : cat(shape_str(p.whole), " whole");
}

}  // namespace

void assemble_parts(const std::string& path, CheckpointData& manifest) {
  const fs::path dir = fs::path(path).parent_path();
  const std::string self = fs::path(path).filename().string();
  const std::string where = "checkpoint '" + path + "'";
  std::unordered_map<std::string, Assembly> acc;
  std::vector<std::string> order;  // first appearance: rank 0's pieces first
  const std::size_t n = manifest.parts.size();
  for (std::size_t k = 0; k < n; ++k) {
    const fs::path part = dir / manifest.parts[k];
    std::error_code ec;
    RT_CHECK(fs::exists(part, ec), where, ": its part file '", manifest.parts[k], "' (", k + 1, " of ", n,
             ") is missing");
    CheckpointData p = read_checkpoint_file(part.string());  // verifies every piece's checksum
    RT_CHECK(p.part_of == self, where, ": part file '", manifest.parts[k], "' belongs to '", p.part_of,
             "', not to this checkpoint");
    RT_CHECK(p.places.size() == p.tensors.size(), where, ": part file '", manifest.parts[k], "' has ",
             p.places.size(), " places for ", p.tensors.size(), " tensors");
    for (std::size_t i = 0; i < p.tensors.size(); ++i) {
      const auto& [name, piece] = p.tensors[i];
      const PiecePlace& pl = p.places[i];
      const std::string tw = cat(where, ": tensor '", name, "' in part file '", manifest.parts[k], "'");
      RT_CHECK(!pl.shard.sharded() || (pl.shard.dim >= 0 && static_cast<std::size_t>(pl.shard.dim) < pl.whole.size() &&
                                       pl.shard.parts >= 1 && pl.shard.index >= 0 &&
                                       pl.shard.index < pl.shard.parts && pl.shard.blocks >= 1 &&
                                       pl.whole[static_cast<std::size_t>(pl.shard.dim)] %
                                               (std::int64_t{pl.shard.parts} * pl.shard.blocks) ==
                                           0),
               tw, " has an impossible split (", split_str(pl), ", part ", pl.shard.index, ")");
      auto [it, fresh] = acc.try_emplace(name);
      Assembly& a = it->second;
      if (fresh) {
        a.dtype = piece.dtype();
        a.place = pl;
        a.parts.resize(static_cast<std::size_t>(a.count()));
        a.filled.assign(static_cast<std::size_t>(a.count()), 0);
        order.push_back(name);
      }
      RT_CHECK(a.dtype == piece.dtype() && same_split(a.place, pl), tw, " is ", dtype_name(piece.dtype()), " ",
               split_str(pl), ", but another part has it ", dtype_name(a.dtype), " ", split_str(a.place));
      const std::size_t idx = pl.shard.sharded() ? static_cast<std::size_t>(pl.shard.index) : 0;
      Tensor& dst = a.parts[idx];
      if (!dst.defined()) dst = Tensor::empty(a.part_shape(), a.dtype);
      RT_CHECK(pl.begin >= 0 && pl.begin + piece.numel() <= dst.numel(), tw, " covers elements ", pl.begin, "..",
               pl.begin + piece.numel(), " of a part of ", dst.numel());
      if (piece.numel())
        std::memcpy(static_cast<char*>(dst.raw()) + pl.begin * dtype_size(a.dtype), piece.raw(), piece.nbytes());
      a.filled[idx] += piece.numel();
    }
  }
  for (const std::string& name : order) {
    Assembly& a = acc[name];
    const std::int64_t per = shape_numel(a.part_shape());
    for (std::size_t idx = 0; idx < a.parts.size(); ++idx)
      RT_CHECK(a.filled[idx] == per, where, ": tensor '", name, "' is incomplete: its part files hold ", a.filled[idx],
               " of ", per, " elements", a.parts.size() > 1 ? cat(" of tensor-parallel part ", idx) : std::string(),
               " (a part file of another write?)");
    Tensor whole = a.parts[0];
    if (a.place.shard.sharded()) {
      whole = Tensor::empty(a.place.whole, a.dtype);
      ShardSpec s = a.place.shard;
      s.global = a.place.whole;
      for (std::size_t idx = 0; idx < a.parts.size(); ++idx) {
        s.index = static_cast<int>(idx);
        place_shard(a.parts[idx], s, whole);
        a.parts[idx] = Tensor();  // one part at a time beside the whole
      }
    }
    manifest.tensors.emplace_back(name, whole);
  }
}

}  // namespace ringtrain
