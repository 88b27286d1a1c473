// A checkpoint's index (checkpoint_read.hpp, step 1): its head, and every
// stored piece's name, place, checksum and byte offset, read from the HDF5
// metadata only. The collective form indexes file k on rank k % size and
// shares the lists in one all-gather, so indexing costs one file per rank.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/data/schema.hpp"
#include "ringtrain/checkpoint/read.hpp"
#include "geometry.hpp"
#include "h5.hpp"

namespace fs = std::filesystem;

namespace ringtrain {
namespace {

using namespace ckpt_h5;
using ckpt_detail::PartGeometry;
using ckpt_detail::piece_where;

// One file's head, and nothing else: no tensor data.
CheckpointIndex head_of(const std::string& path) {
  CheckpointIndex ix;
  ix.path = path;
  std::lock_guard lock(data::hdf5_mutex());
  H5 file = open_checkpoint(path);
  ix.head = read_head(file, path);
  return ix;
}

// The head of the manifest (or one file), and the files that hold its pieces.
CheckpointIndex index_head(const std::string& path) {
  CheckpointIndex ix = head_of(path);
  RT_CHECK(ix.head.part_of.empty(), "checkpoint '", path, "' is one rank's part of the parallel checkpoint '",
           ix.head.part_of, "' (in the same directory): resume from that file or from the directory");
  const fs::path dir = fs::path(path).parent_path();
  if (ix.head.parts.empty()) ix.files = {path};
  for (const auto& p : ix.head.parts) ix.files.push_back((dir / p).string());
  return ix;
}

// The pieces of file k, in the file's (name) order. `part`: its tensors are
// pieces with places (a manifest's part, or a part file read alone).
void index_file(const CheckpointIndex& ix, int k, std::vector<StoredPiece>& out, bool part) {
  const std::string& path = ix.files[static_cast<std::size_t>(k)];
  const std::string where = "checkpoint '" + ix.path + "'";
  if (!ix.head.parts.empty()) {
    std::error_code ec;
    RT_CHECK(fs::exists(path, ec), where, ": its part file '", ix.head.parts[static_cast<std::size_t>(k)], "' (",
             k + 1, " of ", ix.files.size(), ") is missing");
  }
  std::lock_guard lock(data::hdf5_mutex());
  H5 file = open_checkpoint(path);
  if (!ix.head.parts.empty()) {
    const CheckpointData head = read_head(file, path);
    const std::string self = fs::path(ix.path).filename().string(), name = ix.head.parts[static_cast<std::size_t>(k)];
    RT_CHECK(!head.part_of.empty(), where, ": its part file '", name, "' is not a part file");
    RT_CHECK(head.part_of == self, where, ": part file '", name, "' belongs to '", head.part_of,
             "', not to this checkpoint");
  }
  H5 group(H5Gopen2(file, "tensors", H5P_DEFAULT), H5Gclose);
  for (const auto& name : tensor_names(file, path)) {
    const std::string tw = part ? cat(where, ": tensor '", name, "' in part file '", fs::path(path).filename().string(), "'")
                                : cat(where, " tensor '", name, "'");
    H5 ds(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose);
    RT_CHECK(ds.id >= 0, tw, ": cannot open it");
    DatasetInfo d = read_dataset_info(ds, tw, part);
    out.push_back({name, d.dtype, shape_numel(d.shape), std::move(d.place), d.crc, k, d.offset});
  }
}

// A piece as JSON (MessagePack on the wire), for the all-gather.
nlohmann::json pack(const StoredPiece& s) {
  const ShardSpec& sh = s.place.shard;
  return {s.name, static_cast<int>(s.dtype), s.numel, s.place.whole, {sh.dim, sh.parts, sh.index, sh.blocks},
          s.place.begin, s.crc, s.file, s.offset};
}

StoredPiece unpack(const nlohmann::json& j) {
  StoredPiece s;
  s.name = j.at(0).get<std::string>();
  s.dtype = static_cast<DType>(j.at(1).get<int>());
  s.numel = j.at(2).get<std::int64_t>();
  s.place.whole = j.at(3).get<Shape>();
  const auto sh = j.at(4).get<std::vector<int>>();
  s.place.shard.dim = sh.at(0);
  s.place.shard.parts = sh.at(1);
  s.place.shard.index = sh.at(2);
  s.place.shard.blocks = sh.at(3);
  if (s.place.shard.sharded()) s.place.shard.global = s.place.whole;
  s.place.begin = j.at(5).get<std::int64_t>();
  s.crc = j.at(6).get<std::uint32_t>();
  s.file = j.at(7).get<int>();
  s.offset = j.at(8).get<std::int64_t>();
  return s;
}

std::string split_str(const PiecePlace& p) {
  return p.shard.sharded() ? cat(shape_str(p.whole), " split in ", p.shard.parts, " along dimension ", p.shard.dim,
                                 p.shard.blocks > 1 ? cat(" (", p.shard.blocks, " blocks)") : std::string())
                           : cat(shape_str(p.whole), " whole");
}

bool same_split(const PiecePlace& a, const PiecePlace& b) {
  return a.whole == b.whole && a.shard.dim == b.shard.dim && a.shard.parts == b.shard.parts &&
         a.shard.blocks == b.shard.blocks;
}

// The tensor table, and (`tiled`: a whole checkpoint, not one part file) every
// tensor tiled exactly by its pieces: each tensor-parallel part of it covered
// once, without gaps or overlaps.
void finish_index(CheckpointIndex& ix, bool tiled = true) {
  std::unordered_map<std::string, std::size_t>& at = ix.tensor_at;
  at.clear();
  struct Span {
    std::int64_t begin, end;
    std::size_t piece;
  };
  std::vector<std::vector<std::vector<Span>>> spans;  // per tensor, per part
  std::vector<PiecePlace> split;
  for (std::size_t i = 0; i < ix.pieces.size(); ++i) {
    const StoredPiece& p = ix.pieces[i];
    const PiecePlace& pl = p.place;
    const std::string tw = piece_where(ix, p);
    const auto& s = pl.shard;
    RT_CHECK(!s.sharded() || (static_cast<std::size_t>(s.dim) < pl.whole.size() && s.parts >= 1 && s.index >= 0 &&
                              s.index < s.parts && s.blocks >= 1 &&
                              pl.whole[static_cast<std::size_t>(s.dim)] % (std::int64_t{s.parts} * s.blocks) == 0),
             tw, " has an impossible split (", split_str(pl), ", part ", s.index, ")");
    auto [it, fresh] = at.try_emplace(p.name, ix.tensors.size());
    if (fresh) {
      ix.tensors.push_back({p.name, p.dtype, pl.whole});
      split.push_back(pl);
      spans.emplace_back(static_cast<std::size_t>(s.sharded() ? s.parts : 1));
    }
    const std::size_t t = it->second;
    RT_CHECK(ix.tensors[t].dtype == p.dtype && same_split(split[t], pl), tw, " is ", dtype_name(p.dtype), " ",
             split_str(pl), ", but another piece has it ", dtype_name(ix.tensors[t].dtype), " ", split_str(split[t]));
    const std::int64_t per = PartGeometry::of(pl).numel;
    RT_CHECK(pl.begin >= 0 && p.numel >= 0 && pl.begin + p.numel <= per, tw, " covers elements ", pl.begin, "..",
             pl.begin + p.numel, " of a part of ", per);
    if (p.numel && tiled) spans[t][s.sharded() ? static_cast<std::size_t>(s.index) : 0].push_back({pl.begin, pl.begin + p.numel, i});
  }
  for (std::size_t t = 0; tiled && t < ix.tensors.size(); ++t) {
    const std::int64_t per = PartGeometry::of(split[t]).numel;
    for (std::size_t idx = 0; idx < spans[t].size(); ++idx) {
      auto& v = spans[t][idx];
      std::sort(v.begin(), v.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
      std::int64_t cursor = 0, held = 0;
      for (const Span& s : v) {
        RT_CHECK(s.begin >= cursor, piece_where(ix, ix.pieces[s.piece]), " holds elements ", s.begin, "..", s.end,
                 ", which another piece holds too (parts of two writes?)");
        cursor = s.end;
        held += s.end - s.begin;
      }
      RT_CHECK(held == per, "checkpoint '", ix.path, "': tensor '", ix.tensors[t].name,
               "' is incomplete: its part files hold ", held, " of ", per, " elements",
               spans[t].size() > 1 ? cat(" of tensor-parallel part ", idx) : std::string(),
               " (a part file of another write?)");
    }
  }
}

}  // namespace

std::size_t CheckpointIndex::bytes() const {
  std::size_t n = 0;
  for (const auto& p : pieces) n += static_cast<std::size_t>(p.numel) * dtype_size(p.dtype);
  return n;
}

CheckpointIndex read_checkpoint_index(const std::string& path) {
  CheckpointIndex ix = index_head(path);
  for (std::size_t k = 0; k < ix.files.size(); ++k) index_file(ix, static_cast<int>(k), ix.pieces, !ix.head.parts.empty());
  finish_index(ix);
  return ix;
}

namespace ckpt_detail {
CheckpointIndex index_file_as_stored(const std::string& path) {
  CheckpointIndex ix = head_of(path);
  ix.files = {path};
  // A manifest's pieces are in other files: as stored, it has none (its part names come back after).
  std::vector<std::string> parts = std::move(ix.head.parts);
  ix.head.parts.clear();
  index_file(ix, 0, ix.pieces, !ix.head.part_of.empty());
  finish_index(ix, false);
  ix.head.parts = std::move(parts);
  return ix;
}
}  // namespace ckpt_detail

CheckpointIndex read_checkpoint_index(const std::string& path, const Communicator& comm) {
  if (comm.size() == 1) return read_checkpoint_index(path);
  CheckpointIndex ix;
  // Every rank reads the head (small) and sees the files: a rank that cannot is named.
  run_agreed(comm, "reading the checkpoint's head", [&] {
    std::error_code ec;
    char host[256] = "?";
    ::gethostname(host, sizeof host - 1);
    RT_CHECK(comm.rank() == 0 || fs::exists(path, ec), "checkpoint '", path, "' is not visible on this rank (host ",
             host, "): every rank reads its share of a checkpoint, so the checkpoint must be on a file system that "
             "every rank sees");
    ix = index_head(path);
  });
  std::vector<StoredPiece> mine;
  run_agreed(comm, "indexing the checkpoint's files", [&] {
    for (std::size_t k = static_cast<std::size_t>(comm.rank()); k < ix.files.size(); k += static_cast<std::size_t>(comm.size()))
      index_file(ix, static_cast<int>(k), mine, !ix.head.parts.empty());
  });
  nlohmann::json list = nlohmann::json::array();
  for (const auto& p : mine) list.push_back(pack(p));
  const std::vector<std::uint8_t> bytes = nlohmann::json::to_msgpack(list);
  std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()));
  std::uint64_t n = bytes.size();
  allgather(&n, 1, counts.data(), DType::i64, comm);
  std::size_t total = 0;
  for (auto c : counts) total += c;
  std::vector<std::uint8_t> all(total);
  allgatherv(bytes.data(), all.data(), counts, DType::u8, comm);
  run_agreed(comm, "checking the checkpoint's pieces", [&] {
    std::size_t at = 0;
    for (std::size_t c : counts) {  // one MessagePack array per rank
      for (const auto& j : nlohmann::json::from_msgpack(all.begin() + static_cast<std::ptrdiff_t>(at),
                                                        all.begin() + static_cast<std::ptrdiff_t>(at + c)))
        ix.pieces.push_back(unpack(j));
      at += c;
    }
    // Ranks sent their files in turn: back to file order (stable within a file).
    std::stable_sort(ix.pieces.begin(), ix.pieces.end(),
                     [](const StoredPiece& a, const StoredPiece& b) { return a.file < b.file; });
    finish_index(ix);
  });
  return ix;
}

}  // namespace ringtrain
