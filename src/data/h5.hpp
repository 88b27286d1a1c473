#pragma once
// Private HDF5 helpers for src/data: RAII handles, attribute I/O and error
// conversion. Rules: callers hold hdf5_mutex() for every call; HDF5's own
// error-stack printing is silenced (H5Eset_auto) and each failure becomes an
// Error naming the file and the operation.
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/core/error.hpp"

namespace ringtrain::data::h5 {

// Owns one hid_t and closes it with the right H5*close for its type.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Turns off HDF5's automatic error printing (once per process; idempotent).
void silence_errors();

// Checks an hid_t/herr_t result; on failure throws "<file>: <what> failed (<HDF5's innermost message>)".
hid_t check_id(hid_t id, const std::string& file, const std::string& what);
void check(herr_t rc, const std::string& file, const std::string& what);

Handle open_file(const std::string& path, hid_t fapl = H5P_DEFAULT);
// Creates (truncating) a file; the latest format is not used so that h5py and
// older h5dump can read it.
Handle create_file(const std::string& path);

// Attributes on an object (file root or dataset).
bool has_attr(hid_t obj, const char* name);
void write_attr_i64(hid_t obj, const char* name, std::int64_t v, const std::string& file);
void write_attr_f64s(hid_t obj, const char* name, const std::vector<double>& v, const std::string& file);
void write_attr_str(hid_t obj, const char* name, const std::string& v, const std::string& file);
void write_attr_strs(hid_t obj, const char* name, const std::vector<std::string>& v, const std::string& file);
std::int64_t read_attr_i64(hid_t obj, const char* name, const std::string& file);
std::vector<double> read_attr_f64s(hid_t obj, const char* name, const std::string& file);
std::string read_attr_str(hid_t obj, const char* name, const std::string& file);
std::vector<std::string> read_attr_strs(hid_t obj, const char* name, const std::string& file);

// Dims of a dataset's dataspace.
std::vector<hsize_t> dims_of(hid_t dset, const std::string& file, const char* name);

}  // namespace ringtrain::data::h5
