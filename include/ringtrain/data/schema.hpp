#pragma once
// The on-disk schema of a prepared data set (data/SCHEMA.md is the full
// description for h5py/h5dump users). Rules kept here:
//  - one HDF5 file per split (single-file layout) or K files per split
//    ("<name>-<split>-SSSSS-of-KKKKK.h5", shard layout); every file is
//    self-describing: /images uint8 [n,C,H,W], /labels int64 [n] and root
//    attributes; a shard knows its index, the shard count and the global index
//    of its first sample, so sample ids are global across shards;
//  - mean/std are per channel over the *train* split, on pixels scaled to
//    [0, 1] (torchvision's convention), and the test split carries the same;
//  - HDF5 1.10 (Debian's parallel build) is not thread-safe: every HDF5 call
//    in ringtrain holds hdf5_mutex() (the checkpoint writer must too).
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace ringtrain::data {

inline constexpr int kSchemaVersion = 2;  // 2: token files
inline constexpr const char* kImages = "images";
inline constexpr const char* kLabels = "labels";
// A token file (language models): /tokens [n] (uint16 or int32) instead of
// /images and /labels, attribute vocab; count is tokens, not samples. Its
// samples are windows of seq_len + 1 tokens (token_windows below).
inline constexpr const char* kTokens = "tokens";

// What one file says about itself (root attributes + dataset shapes).
struct FileInfo {
  std::string path;
  std::string name;                       // data set name, e.g. "fashion-mnist"
  std::string split;                      // "train" / "test"
  int schema_version = 0;
  std::int64_t count = 0;                 // samples in this file
  std::int64_t channels = 0, height = 0, width = 0;
  std::int64_t num_classes = 0;
  std::vector<std::string> class_names;
  std::vector<double> mean, std;          // per channel, pixels in [0, 1]
  std::vector<std::string> source_files;
  std::int64_t shard_index = 0, num_shards = 1;
  std::int64_t first_index = 0;           // global index of sample 0 of this file
  std::int64_t total_count = 0;           // samples in the whole split
  std::int64_t vocab = 0;                 // token files: vocabulary size (0: an image file)
  std::string tokenizer;                  // token files: "bytes" (UTF-8 bytes) or "external"
  bool tokens() const { return vocab > 0; }
  std::int64_t sample_bytes() const { return channels * height * width; }
};

// Training windows in `tokens` tokens at sequence length seq_len: window i is
// tokens [i * seq_len, i * seq_len + seq_len + 1) (inputs and shifted targets).
inline std::int64_t token_windows(std::int64_t tokens, std::int64_t seq_len) {
  return seq_len > 0 && tokens > 0 ? (tokens - 1) / seq_len : 0;
}

// Reads and validates one file's attributes and dataset shapes/dtypes.
// Throws Error naming the file and the problem (missing file or dataset, wrong
// rank, dims or dtype, count mismatch, corrupt or truncated file).
FileInfo read_file_info(const std::string& path);

// The files of `split` in a prepared directory, in shard order: either
// "<dir>/<name>-<split>.h5" or the "<name>-<split>-*-of-*.h5" shards. A path
// to an .h5 file is returned as is. Throws Error when nothing matches.
std::vector<std::string> find_split_files(const std::string& dir_or_file, const std::string& split);

// Process-wide lock around the (non-thread-safe) HDF5 library.
std::mutex& hdf5_mutex();

// Shard file name: "<name>-<split>-00003-of-00008.h5", or "<name>-<split>.h5" when k == 1.
std::string shard_file_name(const std::string& name, const std::string& split, int shard, int k);

}  // namespace ringtrain::data
