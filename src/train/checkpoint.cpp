#include "ringtrain/train/checkpoint.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <regex>

#include "ringtrain/core/allocator.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/data/schema.hpp"

namespace fs = std::filesystem;

namespace ringtrain {
namespace {

const char* kSchema = "ringtrain-checkpoint-1";

// RAII for HDF5 ids.
struct H5 {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  H5(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~H5() {
    if (id >= 0 && close) close(id);
  }
  H5(const H5&) = delete;
  H5& operator=(const H5&) = delete;
  operator hid_t() const { return id; }
};

hid_t h5_type(DType dt) {
  switch (dt) {
    case DType::f32: return H5T_NATIVE_FLOAT;
    case DType::f64: return H5T_NATIVE_DOUBLE;
    case DType::f16:
    case DType::bf16: return H5T_NATIVE_UINT16;
    case DType::i32: return H5T_NATIVE_INT32;
    case DType::i64: return H5T_NATIVE_INT64;
    case DType::u8: return H5T_NATIVE_UINT8;
  }
  return H5T_NATIVE_FLOAT;
}

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  H5 type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, std::max<std::size_t>(1, value.size()));
  H5 space(H5Screate(H5S_SCALAR), H5Sclose);
  H5 attr(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  RT_CHECK(attr.id >= 0 && H5Awrite(attr, type, value.data()) >= 0, "cannot write attribute '", name, "'");
}

std::string read_string_attr(hid_t obj, const char* name, const std::string& where) {
  RT_CHECK(H5Aexists(obj, name) > 0, where, ": attribute '", name, "' is missing");
  H5 attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  H5 type(H5Aget_type(attr), H5Tclose);
  std::size_t n = H5Tget_size(type);
  std::string s(n, '\0');
  H5 mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem, n);
  RT_CHECK(H5Aread(attr, mem, s.data()) >= 0, where, ": cannot read attribute '", name, "'");
  s.resize(std::strlen(s.c_str()));
  return s;
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_checkpoint(const std::string& path, const CheckpointData& data) {
  // HDF5 1.10 is not thread-safe and the loader's prefetch thread reads concurrently.
  std::lock_guard lock(data::hdf5_mutex());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    H5 file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    RT_CHECK(file.id >= 0, "cannot create checkpoint file '", tmp, "' (is the directory writable?)");
    write_string_attr(file, "schema", kSchema);
    write_string_attr(file, "config", data.config_toml);
    H5 group(H5Gcreate2(file, "tensors", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    for (const auto& [name, t] : data.tensors) {
      Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
      hsize_t n = static_cast<hsize_t>(host.numel());
      H5 space(H5Screate_simple(1, &n, nullptr), H5Sclose);
      H5 ds(H5Dcreate2(group, name.c_str(), h5_type(host.dtype()), space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
            H5Dclose);
      RT_CHECK(ds.id >= 0, "checkpoint '", path, "': cannot create dataset for tensor '", name, "'");
      if (n) RT_CHECK(H5Dwrite(ds, h5_type(host.dtype()), H5S_ALL, H5S_ALL, H5P_DEFAULT, host.raw()) >= 0,
                      "checkpoint '", path, "': cannot write tensor '", name, "' (disk full?)");
      write_string_attr(ds, "dtype", dtype_name(host.dtype()));
    }
    H5 scalars(H5Gcreate2(file, "scalars", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    for (const auto& [name, v] : data.scalars) {
      H5 space(H5Screate(H5S_SCALAR), H5Sclose);
      H5 attr(H5Acreate2(scalars, name.c_str(), H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      RT_CHECK(attr.id >= 0 && H5Awrite(attr, H5T_NATIVE_INT64, &v) >= 0, "checkpoint '", path,
               "': cannot write scalar '", name, "'");
    }
    RT_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL) >= 0, "checkpoint '", path, "': flush failed (disk full?)");
  }
  fsync_path(tmp, false);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  RT_CHECK(!ec, "checkpoint '", path, "': rename from temporary file failed: ", ec.message());
  fsync_path(target.has_parent_path() ? target.parent_path().string() : ".", true);
}

CheckpointData read_checkpoint(const std::string& path) {
  std::lock_guard lock(data::hdf5_mutex());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  RT_CHECK(fs::exists(path), "checkpoint '", path, "' does not exist");
  H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  RT_CHECK(file.id >= 0, "checkpoint '", path, "' is not a readable HDF5 file (truncated or corrupt?)");
  std::string schema = read_string_attr(file, "schema", "checkpoint '" + path + "'");
  RT_CHECK(schema == kSchema, "checkpoint '", path, "' has schema '", schema, "', expected '", kSchema, "'");
  CheckpointData out;
  out.config_toml = read_string_attr(file, "config", "checkpoint '" + path + "'");

  RT_CHECK(H5Lexists(file, "tensors", H5P_DEFAULT) > 0, "checkpoint '", path, "' has no /tensors group");
  H5 group(H5Gopen2(file, "tensors", H5P_DEFAULT), H5Gclose);
  H5G_info_t info;
  H5Gget_info(group, &info);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[512];
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME,
                       H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT);
    H5 ds(H5Dopen2(group, name, H5P_DEFAULT), H5Dclose);
    RT_CHECK(ds.id >= 0, "checkpoint '", path, "': cannot open tensor '", name, "'");
    DType dt = parse_dtype(read_string_attr(ds, "dtype", "checkpoint '" + path + "' tensor '" + name + "'"));
    H5 space(H5Dget_space(ds), H5Sclose);
    hsize_t n = 0;
    RT_CHECK(H5Sget_simple_extent_ndims(space) == 1, "checkpoint '", path, "': tensor '", name, "' is not 1-D");
    H5Sget_simple_extent_dims(space, &n, nullptr);
    Tensor t = Tensor::empty({static_cast<std::int64_t>(n)}, dt);
    if (n) RT_CHECK(H5Dread(ds, h5_type(dt), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw()) >= 0, "checkpoint '",
                    path, "': cannot read tensor '", name, "' (truncated file?)");
    out.tensors.emplace_back(name, t);
  }
  if (H5Lexists(file, "scalars", H5P_DEFAULT) > 0) {
    H5 scalars(H5Gopen2(file, "scalars", H5P_DEFAULT), H5Gclose);
    int na = H5Aget_num_attrs(scalars);
    for (int i = 0; i < na; ++i) {
      H5 attr(H5Aopen_by_idx(scalars, ".", H5_INDEX_NAME, H5_ITER_INC, i, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      char name[256];
      H5Aget_name(attr, sizeof name, name);
      std::int64_t v = 0;
      H5Aread(attr, H5T_NATIVE_INT64, &v);
      out.scalars[name] = v;
    }
  }
  return out;
}

void restore_tensor(const CheckpointData& ckpt, const std::string& name, Tensor dst) {
  for (const auto& [n, t] : ckpt.tensors) {
    if (n != name) continue;
    RT_CHECK(t.dtype() == dst.dtype() && t.numel() == dst.numel(), "checkpoint tensor '", name, "' is ",
             dtype_name(t.dtype()), " with ", t.numel(), " elements, but the model expects ",
             dtype_name(dst.dtype()), " with ", dst.numel(), " (was it written for another model?)");
    copy_bytes(dst.raw(), dst.device(), t.raw(), t.device(), t.nbytes());
    return;
  }
  RT_FAIL("checkpoint has no tensor '", name, "' (was it written for another model or optimizer?)");
}

CheckpointDir::CheckpointDir(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

std::vector<std::pair<int, std::string>> CheckpointDir::list() const {
  std::vector<std::pair<int, std::string>> out;
  if (!fs::is_directory(dir_)) return out;
  static const std::regex re("ckpt-([0-9]+)\\.h5");
  for (const auto& e : fs::directory_iterator(dir_)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    if (std::regex_match(name, m, re)) out.emplace_back(std::stoi(m[1]), e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string CheckpointDir::save(int epoch, const CheckpointData& data) {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%04d.h5", epoch);
  std::string path = (fs::path(dir_) / name).string();
  write_checkpoint(path, data);
  auto all = list();
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep_) < all.size(); ++i) fs::remove(all[i].second);
  return path;
}

std::string CheckpointDir::latest() const {
  auto all = list();
  return all.empty() ? std::string() : all.back().second;
}

}  // namespace ringtrain
