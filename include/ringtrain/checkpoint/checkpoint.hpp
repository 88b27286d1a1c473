#pragma once
// Checkpoints in HDF5, written by one rank atomically: a temporary file in the
// same directory, fsync, rename, fsync of the directory — a crash leaves either
// the old checkpoint or the new one, never half of one; a failed write removes
// its temporary file. Schema "ringtrain-checkpoint-2" (h5dump-able):
//   /tensors/<name>   one dataset per named tensor, in its own shape; names hold
//                     '/' ("param/conv1.weight" is /tensors/param/conv1.weight);
//                     float16/bfloat16 stored as uint16 bits; attributes
//                     "dtype" (ringtrain dtype name) and "crc32" (of the raw bytes,
//                     verified on every read)
//   /scalars          attributes: int64 values (epochs_done, step, ...)
//   /strings          attributes: text values (run_id, run_identity)
//   attributes on /:  "schema", "config" = TOML text
// Any other file (not HDF5, no schema, another schema) is refused, saying so.
//
// Checkpoints written in parallel (checkpoint.parallel): each rank writes its
// share of the state to a part file, schema "ringtrain-checkpoint-2-part",
// ckpt-<run>-s<step>.part-<k>-of-<n>.h5, whose tensors are 1-D pieces with
// attributes "whole" (the whole tensor's shape), "shard" (dim, parts, index,
// blocks of its tensor-parallel split; dim -1: replicated) and "begin" (the
// first element within that part); root attribute "part_of" names the
// manifest. Once every part is durable, rank 0 writes the manifest
// ckpt-<run>-s<step>.h5: the usual file without tensors, with root attribute
// "parts" (the part file names, one per line). The manifest is the commit
// point: a crash before it leaves the previous checkpoint the newest intact
// one.
//
// One writer, one reader: every file is written by write_checkpoint (the
// trainer's CheckpointSession decides who writes what: rank 0 the whole state
// to one file, or every rank its part, then rank 0 the manifest), and every
// read goes through the sharded reader (read.hpp): resume, eval, generate and
// export read only their own ranges; read_checkpoint below is that reader
// with one whole-tensor target per tensor, for tools and tests.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/core/tensor.hpp"
#include "ringtrain/nn/parameters.hpp"

namespace ringtrain {

inline constexpr const char* kCheckpointSchema = "ringtrain-checkpoint-2";
inline constexpr const char* kCheckpointPartSchema = "ringtrain-checkpoint-2-part";

struct CheckpointData {
  std::vector<std::pair<std::string, Tensor>> tensors;  // any device; copied to host to write
  std::map<std::string, std::int64_t> scalars;
  std::map<std::string, std::string> strings;
  std::string config_toml;
  // A part file: the manifest's file name, and where each tensor (a 1-D piece)
  // sits in its whole tensor, parallel to `tensors`.
  std::string part_of;
  std::vector<PiecePlace> places;
  // A manifest: its part files' names (same directory), in rank order.
  std::vector<std::string> parts;
};

// Test hook: when set, write_checkpoint calls it after each tensor is written
// (a thrown Error simulates a failed write, e.g. ENOSPC). With checkpoint.async
// it runs on the background writer's thread.
using CheckpointWriteHook = std::function<void(const std::string& tensor)>;

void write_checkpoint(const std::string& path, const CheckpointData& data, const CheckpointWriteHook& hook = {});
// write_checkpoint's two halves: the file's bytes, built in memory (`path`
// only names it in errors), and their atomic write (a temporary file beside
// `path`, fsync, rename; `sync_dir`: fsync the directory too). The in-memory
// snapshots (checkpoint.memory_every_steps) send the same bytes to a buddy.
std::vector<char> checkpoint_image(const std::string& path, const CheckpointData& data,
                                   const CheckpointWriteHook& hook = {});
void write_file_atomic(const std::string& path, const std::vector<char>& bytes, bool sync_dir);
// Reads every tensor whole into new host tensors, verifying each piece's
// checksum; a manifest's whole tensors come from its part files (an error
// names a missing, foreign or incomplete part). A part file alone is refused.
CheckpointData read_checkpoint(const std::string& path);
// One file as stored: a part file's pieces with their places, a manifest's
// part names without its tensors.
CheckpointData read_checkpoint_file(const std::string& path);
// Copies checkpoint tensor `name` into `dst` (any device), checking dtype and shape.
void restore_tensor(const CheckpointData& ckpt, const std::string& name, Tensor dst);
// The files that make up the checkpoint at `path`: the file itself and, for a
// parallel checkpoint, its part files beside it (to copy or move one whole).
std::vector<std::string> checkpoint_files(const std::string& path);
// CRC-32 (IEEE, as zlib's crc32) of a byte range.
std::uint32_t crc32(const void* data, std::size_t bytes, std::uint32_t crc = 0);

// A directory of checkpoints named ckpt-<run id>-s<step>.h5. Runs stay apart:
// rotation keeps the newest `keep` of one run and never touches another run's files.
class CheckpointDir {
 public:
  struct Entry {
    std::string path, run_id;
    std::int64_t step = 0;
    std::filesystem::file_time_type mtime;
  };
  CheckpointDir(std::string dir, int keep);
  std::string save(const std::string& run_id, std::int64_t step, const CheckpointData& data,
                   const CheckpointWriteHook& hook = {}) const;  // returns the path
  std::string path_for(const std::string& run_id, std::int64_t step) const;  // the file save() writes
  // Removes run `run_id`'s checkpoints beyond the newest `keep` (by step), each with its part files.
  void rotate(const std::string& run_id) const;
  // Rank `rank`'s part of the parallel checkpoint whose manifest is path_for(run_id, step).
  std::string part_path_for(const std::string& run_id, std::int64_t step, int rank, int ranks) const;
  std::vector<Entry> list() const;   // newest first (write time, then step)
  std::string latest() const;        // newest file, intact or not; "" when none
  // Removes temporary files left by an interrupted write of run `run_id`, and
  // its part files that no manifest names (a parallel write cut short); returns how many.
  int remove_stale_temps(const std::string& run_id) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int keep_;
};

// The checkpoints `path` names, newest first: the file itself, or a
// directory's ckpt-*.h5 (newest written first). Throws when there is none.
std::vector<std::string> checkpoint_candidates(const std::string& path);

// The newest checkpoint under `path` (a file, or a directory searched newest
// first) that reads, verifies and passes `accept` (which throws an Error saying
// why not). `skipped` receives "<file>: <reason>" for each newer one passed
// over. Throws when none is usable, listing every reason.
struct FoundCheckpoint {
  std::string path;
  CheckpointData data;
  std::vector<std::string> skipped;
};
FoundCheckpoint find_intact_checkpoint(const std::string& path,
                                       const std::function<void(const CheckpointData&)>& accept = {});
// The newest checkpoint under `path` whose head and index read — its
// configuration, position and part names (`data` without tensors) — reading
// no tensor data: what `generate` needs to build its model.
FoundCheckpoint find_checkpoint_head(const std::string& path);

}  // namespace ringtrain
