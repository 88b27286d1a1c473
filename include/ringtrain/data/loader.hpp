#pragma once
// Loader: a rank's batches of a prepared split, made ahead of time by a
// background thread. Rules kept:
//  - opening is collective over the communicator: every rank validates its
//    files and options, and an Error on any rank is thrown on every rank;
//  - sample assignment is the Sampler's (sampler.hpp): global per-epoch
//    permutation by default, same steps per epoch on every rank;
//  - next() returns batches in order: images f32 [b,C,H,W], normalised with the
//    file's train mean/std ((x/255 - mean_c) / std_c), labels i64 [b]. A batch's
//    tensors view one of the loader's reusable buffers and stay valid until the
//    next call to next()/set_epoch()/skip()/seek()/stop() (copy to keep);
//  - next() returns nullopt at the end of an epoch; the following next() starts
//    epoch + 1 (set_epoch(e) jumps to epoch e). The prefetch thread runs ahead by
//    `prefetch_depth` batches, across the epoch boundary (except under MPI-IO);
//  - augmentation (random crop with zero padding, horizontal flip) is drawn from
//    (seed, epoch, sample id) — not the rank — so batches do not depend on the
//    rank count, and the 2×32 == 1×64 exactness holds with augmentation on;
//  - cache policy: `auto_` keeps the rank's samples in memory when they take
//    < cache_limit_bytes (global mode: the whole split, since every epoch draws
//    from all of it; shard_local: the rank's shards), else reads per batch;
//  - MPI-IO (`mpio`): collective reads, single-file layout, no cache; prepare the
//    file with a contiguous layout (StorageOptions::chunk_samples = -1): parallel
//    HDF5 1.10 handles scattered selections of chunked data ~50x slower. Every rank
//    must make the same loader calls (set_epoch/skip/seek/destroy): the prefetch
//    thread issues exactly one collective read per step, and finishes a started
//    epoch's reads before it stops;
//  - wait_seconds(): time next() spent blocked on the prefetch thread.
//  - token files (language models, schema.hpp): a sample is a window of
//    seq_len + 1 tokens of the split's stream (window i starts at token
//    i * seq_len), drawn by the same Sampler, so batches are deterministic
//    per (epoch, position) and sharded by rank alike; images is then f32
//    [b, seq_len] (token ids as floats: exact below 2^24) and labels i64
//    [b, seq_len] the next tokens. The tokens are held in memory.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/tensor.hpp"
#include "ringtrain/data/sampler.hpp"
#include "ringtrain/data/schema.hpp"

namespace ringtrain::data {

enum class CachePolicy { auto_, always, never };

// Where batch buffers live. Default: the registry's CPU allocator. The CUDA
// backend passes pinned host memory (cudaHostAlloc) so uploads can be async.
struct HostMemory {
  std::function<void*(std::size_t)> allocate;
  std::function<void(void*, std::size_t)> deallocate;
};

struct Augment {
  int crop_padding = 0;   // random crop of HxW from the image zero-padded by this much (0 = off)
  bool hflip = false;     // horizontal flip with probability 1/2
};

struct LoaderOptions {
  std::vector<std::string> files;  // one split's files in shard order (find_split_files)
  std::int64_t batch_size = 64;    // per rank
  std::uint64_t seed = 0;
  bool shuffle = true;
  ShuffleMode shuffle_mode = ShuffleMode::global;
  TailPolicy tail = TailPolicy::pad;
  int prefetch_depth = 2;          // ready batches kept ahead (>= 1; 2 = double buffering)
  CachePolicy cache = CachePolicy::auto_;
  std::int64_t cache_limit_bytes = std::int64_t(1) << 30;
  bool mpio = false;               // collective MPI-IO reads (single-file layout)
  bool normalize = true;           // false: raw pixel values 0..255 as float
  std::int64_t seq_len = 0;        // token files: tokens per sample (required there, ignored for images)
  Augment augment;
  HostMemory host_memory;
};

struct Batch {
  Tensor images;                  // f32 [b, C, H, W] (token files: [b, seq_len] token ids)
  Tensor labels;                  // i64 [b] (token files: [b, seq_len], the next tokens)
  std::int64_t epoch = 0, step = 0;
  std::int64_t valid = 0;         // leading samples that are not padding (== b except in the pad tail)
  const std::vector<std::int64_t>* ids = nullptr;  // global sample ids, batch order
};

struct LoaderState {
  std::int64_t epoch = 0, step = 0;  // of the next batch next() returns
};

class Loader {
 public:
  Loader(LoaderOptions opt, const Communicator& comm);  // collective
  ~Loader();                                            // stops and joins the prefetch thread
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  std::optional<Batch> next();
  void set_epoch(std::int64_t epoch);  // next() returns (epoch, 0)
  void skip(std::int64_t steps);       // advance within the current epoch (resume)
  void seek(LoaderState s);
  LoaderState state() const;
  void stop();                         // joins the prefetch thread; next() restarts it

  std::int64_t steps_per_epoch() const;
  std::int64_t num_samples() const;    // in the split (token files: windows)
  std::int64_t batch_size() const;
  const FileInfo& info() const;        // the split's attributes (shard 0's file)
  bool cached() const;                 // whether samples are served from memory
  double wait_seconds() const;         // total time next() blocked
  double epoch_wait_seconds() const;   // same, since the current epoch began

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringtrain::data
