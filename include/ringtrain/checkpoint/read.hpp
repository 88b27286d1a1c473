#pragma once
// The one reader of checkpoints (resume, eval, generate, export): each rank
// reads only the element ranges it restores, straight from the files, and no
// rank assembles or receives the whole state. read_checkpoint (checkpoint.hpp)
// is this reader with one whole-tensor target per tensor, for tools and tests.
//
//  1. Index: the metadata of a checkpoint — the manifest's head (position,
//     configuration, part names) and, per part file, its pieces with their
//     places, checksums and byte offsets; no tensor data. The collective form
//     indexes file k on rank k % size and shares the lists (a few hundred
//     bytes per piece). The pieces must tile every tensor exactly.
//  2. Verify: every stored piece is read whole by exactly one rank (the
//     pieces dealt out in equal byte shares, in file order, so a relaunch at
//     the writer's size verifies about its own part) and checked against its
//     CRC-32; float state (param/, buffer/, optim/) must be finite. A CRC
//     covers a whole piece, and a rank usually needs only part of one when
//     the layout changed: verifying apart from restoring keeps every checksum
//     checked at the cost of reading the state once more in total (1/size of
//     it per rank), and lets a corrupt checkpoint be skipped before anything
//     is overwritten. Errors name the file and the tensor, on every rank.
//  3. Restore: each rank reads, with pread at the piece's offset in its file,
//     the intersection of every stored piece with each of its targets: its
//     tensor-parallel shard of a tensor (blocks of a fused q|k|v split
//     included), its ZeRO-1 slice of an optimizer tensor, its stage's
//     replicated tensors. A piece stored otherwise (chunked, compressed,
//     another byte order: files rewritten by other tools) is read whole
//     through HDF5 instead.
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/nn/parameters.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"

namespace ringtrain {

// One stored piece: elements [place.begin, place.begin + numel) of part
// place.shard of tensor `name` (a one-file checkpoint's tensors are whole,
// replicated pieces).
struct StoredPiece {
  std::string name;
  DType dtype = DType::f32;
  std::int64_t numel = 0;
  PiecePlace place;
  std::uint32_t crc = 0;
  int file = 0;              // in CheckpointIndex::files
  std::int64_t offset = -1;  // of its bytes in the file; -1: read through HDF5
};

struct StoredTensor {
  std::string name;
  DType dtype = DType::f32;
  Shape whole;
};

struct CheckpointIndex {
  std::string path;                  // the manifest or the one file
  CheckpointData head;               // scalars, strings, configuration, part names; no tensors
  std::vector<std::string> files;    // the files holding the pieces: the parts, or the one file
  std::vector<StoredPiece> pieces;   // in file order
  std::vector<StoredTensor> tensors; // in order of first appearance
  std::unordered_map<std::string, std::size_t> tensor_at;  // name -> index in `tensors`
  std::size_t bytes() const;         // of every piece
};

// One process: the index of the checkpoint at `path` (a manifest or one
// file). Errors name the file: missing, foreign or not a checkpoint, a part
// alone, pieces that disagree or do not tile a tensor.
CheckpointIndex read_checkpoint_index(const std::string& path);
// Collective: the same on every rank, each indexing its share of the files.
CheckpointIndex read_checkpoint_index(const std::string& path, const Communicator& comm);

struct CheckpointReadStats {
  std::size_t restored_bytes = 0;  // read into this rank's targets
  std::size_t verified_bytes = 0;  // read to verify the pieces dealt to this rank
  std::size_t reads = 0;           // pread calls (or whole-piece HDF5 reads)
};

// What verify_checkpoint reads and checks.
struct VerifyScope {
  bool optimizer = true;  // false: only param/ and buffer/ pieces (a weights-only load reads no optimizer byte)
  bool finite = true;     // float state (param/, buffer/, optim/) must hold no NaN or Inf
};

// Collective: every piece in scope verified once (step 2); an Error on every
// rank names the file and tensor of the first bad piece. Returns this rank's reads.
CheckpointReadStats verify_checkpoint(const CheckpointIndex& ix, const Communicator& comm,
                                      const VerifyScope& scope = {});
// One process: verifies every piece in scope.
CheckpointReadStats verify_checkpoint(const CheckpointIndex& ix, const VerifyScope& scope = {});

// What a rank restores: elements [place.begin, place.begin + dst.numel()) in
// row-major order of part place.shard of tensor `name` (replicated: of the
// whole tensor), into `dst` (host memory, e.g. a view of the live state).
struct ReadTarget {
  std::string name;
  Tensor dst;
  PiecePlace place;
  bool optional = false;  // restored only when the checkpoint holds it
  bool found = false;     // set by read_targets
};

// The stored tensor target `t` reads, as an index into ix.tensors, checked:
// its dtype and whole shape are the stored one's (a [1] tensor may be wanted
// as a scalar). -1 when the checkpoint lacks it and it is optional; an Error
// naming the checkpoint and the tensor when it lacks it otherwise or differs.
std::ptrdiff_t find_target(const CheckpointIndex& ix, const ReadTarget& t);

// Local: fills every target from the pieces that hold its elements (each
// target checked by find_target). Does not verify checksums (verify_checkpoint did).
CheckpointReadStats read_targets(const CheckpointIndex& ix, std::vector<ReadTarget>& targets);

// One process, for tools that need whole tensors once (export): the
// checkpoint's files mapped read-only, each tensor's pieces verified (CRC-32;
// float state finite) as they are used, so each stored byte is read once —
// verify_checkpoint then read_targets read it twice. Not for pieces that
// pread cannot reach (offset -1): those are read whole through HDF5.
class MappedCheckpoint {
 public:
  explicit MappedCheckpoint(const CheckpointIndex& ix);
  ~MappedCheckpoint();
  MappedCheckpoint(const MappedCheckpoint&) = delete;
  MappedCheckpoint& operator=(const MappedCheckpoint&) = delete;

  // Tensor ix.tensors[k] whole, row-major in its stored dtype, its pieces
  // verified: a pointer into the mapping when one piece holds it whole (no
  // copy), else assembled in `scratch`. Errors name the file and the tensor.
  const void* whole(std::size_t k, std::vector<char>& scratch);
  const CheckpointReadStats& stats() const { return st_; }

 private:
  const char* piece_bytes(const StoredPiece& p, std::vector<char>& tmp);

  const CheckpointIndex& ix_;
  std::vector<std::pair<void*, std::size_t>> maps_;  // per file, mapped on first use
  std::vector<std::vector<std::size_t>> pieces_of_;  // per tensor, its pieces
  CheckpointReadStats st_;
};

}  // namespace ringtrain
