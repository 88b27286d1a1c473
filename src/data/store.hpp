#pragma once
// SampleStore: pixel bytes of global sample ids, from a rank's files.
// Policy: with `cache` the rank's files are read whole at open (one sequential
// H5Dread per file) and batches are memcpy'd from memory; otherwise each batch
// is one H5Dread per file touched, selecting the union of runs of consecutive
// sorted ids (a hyperslab union), into a scratch buffer that is then scattered
// into batch order. With MPI-IO (single file only) that read is collective.
// Labels of every file the rank reads are always held in memory (8 B/sample).
#include <cstdint>
#include <memory>
#include <vector>

#include "h5.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/data/schema.hpp"

namespace ringtrain::data {

class SampleStore {
 public:
  // infos: every file of the split (shard order); open only `shards`.
  // mpio: collective reads over `comm` (a private dup); requires one file.
  SampleStore(const std::vector<FileInfo>& infos, const std::vector<int>& shards, bool cache, bool mpio,
              const Communicator& comm);
  ~SampleStore();

  std::int64_t sample_bytes() const { return sb_; }
  bool cached() const { return cached_; }
  std::int64_t label(std::int64_t id) const;
  // Copies the pixels of ids[0..n) to dst (n * sample_bytes), in that order.
  // Not thread-safe: one reader (the prefetch thread).
  void read(const std::int64_t* ids, std::int64_t n, std::uint8_t* dst);
  // Bytes this rank's cache takes / would take.
  static std::int64_t bytes_for(const std::vector<FileInfo>& infos, const std::vector<int>& shards);

 private:
  struct File {
    const FileInfo* info = nullptr;
    h5::Handle file, images;
    std::vector<std::int64_t> labels;
    std::vector<std::uint8_t> pixels;  // when cached
  };
  File& file_of(std::int64_t id, std::int64_t& local);
  void read_run(std::int64_t id, std::int64_t count, std::uint8_t* dst);     // caller holds hdf5_mutex()
  void read_union(const std::int64_t* ids, std::int64_t n, std::uint8_t* dst);  // caller holds hdf5_mutex()
  const File& file_of(std::int64_t id, std::int64_t& local) const;

  std::vector<FileInfo> infos_;
  std::vector<std::unique_ptr<File>> files_;  // by shard index; null if not opened
  std::int64_t sb_ = 0;
  bool cached_ = false, mpio_ = false;
  bool union_reads_ = false;  // MPI-IO: one collective read per batch (chunks of > 1 image)
  Communicator io_comm_;
  h5::Handle dxpl_;
  // Scratch, reused across batches (no allocation after warm-up).
  std::vector<std::int64_t> order_, uniq_;
  std::vector<std::uint8_t> scratch_;
};

}  // namespace ringtrain::data
