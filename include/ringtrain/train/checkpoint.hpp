#pragma once
// Checkpoints in HDF5, written by one rank atomically: a temporary file in the
// same directory, fsync, rename, fsync of the directory — a crash leaves either
// the old checkpoint or the new one, never half of one. Schema (h5dump-able):
//   /tensors/<name>   one dataset per named tensor (float16/bfloat16 stored as
//                     uint16 bits), attribute "dtype" = ringtrain dtype name
//   /scalars          attributes: int64 values (epoch, step, seed, ...)
//   attributes on /:  "schema" = "ringtrain-checkpoint-1", "config" = TOML text
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/core/tensor.hpp"

namespace ringtrain {

struct CheckpointData {
  std::vector<std::pair<std::string, Tensor>> tensors;  // any device; copied to host to write
  std::map<std::string, std::int64_t> scalars;
  std::string config_toml;
};

void write_checkpoint(const std::string& path, const CheckpointData& data);
// Reads every tensor into new host tensors.
CheckpointData read_checkpoint(const std::string& path);
// Copies checkpoint tensor `name` into `dst` (any device), checking dtype and element count.
void restore_tensor(const CheckpointData& ckpt, const std::string& name, Tensor dst);

// A directory of checkpoints named ckpt-<epoch>.h5, keeping the newest `keep`.
class CheckpointDir {
 public:
  CheckpointDir(std::string dir, int keep);
  std::string save(int epoch, const CheckpointData& data);  // returns the path
  std::string latest() const;                                // "" when none
  const std::string& dir() const { return dir_; }

 private:
  std::vector<std::pair<int, std::string>> list() const;
  std::string dir_;
  int keep_;
};

}  // namespace ringtrain
