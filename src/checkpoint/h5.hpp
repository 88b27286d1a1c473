#pragma once
// HDF5 plumbing shared by the checkpoint writer, the whole-tensor reader
// (checkpoint.cpp) and the sharded reader (checkpoint_index.cpp): ids closed
// by RAII, attributes, and one file's head and datasets as checkpoint.hpp's
// schema lays them out. Callers hold data::hdf5_mutex() (HDF5 1.10 is not
// thread-safe, and the loader's prefetch thread reads concurrently).
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/checkpoint/checkpoint.hpp"

namespace ringtrain::ckpt_h5 {

struct H5 {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  H5(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~H5() {
    if (id >= 0 && close) close(id);
  }
  H5(H5&& o) noexcept : id(std::exchange(o.id, -1)), close(o.close) {}
  H5(const H5&) = delete;
  H5& operator=(const H5&) = delete;
  operator hid_t() const { return id; }
};

hid_t h5_type(DType dt);  // float16/bfloat16 as uint16 bits

void write_string_attr(hid_t obj, const char* name, const std::string& value);
void write_int_attr(hid_t obj, const char* name, std::int64_t v);
void write_ints_attr(hid_t obj, const char* name, const std::vector<std::int64_t>& v);
std::string read_string_attr(hid_t obj, const char* name, const std::string& where);
std::int64_t read_int_attr(hid_t obj, const char* name, const std::string& where);
std::vector<std::int64_t> read_ints_attr(hid_t obj, const char* name, const std::string& where);

// Opens a checkpoint file read-only; an error says when it is missing, not
// HDF5, or not a ringtrain checkpoint (its schema).
H5 open_checkpoint(const std::string& path);
// Its head: configuration, part_of (a part file), parts (a manifest),
// scalars and strings; no tensors.
CheckpointData read_head(hid_t file, const std::string& path);
// The datasets under /tensors (their names hold '/'), in name order.
std::vector<std::string> tensor_names(hid_t file, const std::string& path);

// One stored tensor: dtype, shape, checksum, its place (part files: the
// attributes; one file: the whole tensor), and where its bytes start in the
// file (-1 when they cannot be read with pread: not contiguous, not this
// machine's byte order, a user block, or no data).
struct DatasetInfo {
  DType dtype = DType::f32;
  Shape shape;
  std::uint32_t crc = 0;
  PiecePlace place;
  std::int64_t offset = -1;
};
DatasetInfo read_dataset_info(hid_t ds, const std::string& where, bool part);

}  // namespace ringtrain::ckpt_h5
