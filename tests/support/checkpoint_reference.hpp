#pragma once
// An independent reader of the checkpoint format (checkpoint/checkpoint.hpp)
// for tests: every dataset read whole with H5Dread, a manifest's part files'
// 1-D pieces copied into their tensor-parallel parts and those placed with
// nn's place_shard. It shares no code with ringtrain's one reader (the index,
// pread ranges and the overlap geometry of checkpoint/read.hpp), so tests
// check that reader against it. Checks nothing: tests give it good files.
#include <hdf5.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/core/tensor.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"

namespace ringtrain::test_support {

namespace detail {

inline std::string string_attr(hid_t obj, const char* name) {
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT), t = H5Aget_type(a), m = H5Tcopy(H5T_C_S1);
  std::string s(H5Tget_size(t), '\0');
  H5Tset_size(m, s.size());
  H5Aread(a, m, s.data());
  H5Tclose(m), H5Tclose(t), H5Aclose(a);
  s.resize(std::strlen(s.c_str()));
  return s;
}

inline std::vector<std::int64_t> ints_attr(hid_t obj, const char* name) {
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT), sp = H5Aget_space(a);
  std::vector<std::int64_t> v(static_cast<std::size_t>(H5Sget_simple_extent_npoints(sp)));
  H5Aread(a, H5T_NATIVE_INT64, v.data());
  H5Sclose(sp), H5Aclose(a);
  return v;
}

inline herr_t add_name(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

// Calls f(name, dataset id, tensor holding its data in its stored shape) for each dataset under /tensors.
template <typename F>
void each_dataset(const std::string& path, F&& f) {
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), g = H5Gopen2(file, "tensors", H5P_DEFAULT);
  std::vector<std::string> names;
  H5Lvisit(g, H5_INDEX_NAME, H5_ITER_INC, add_name, &names);
  for (const std::string& n : names) {
    hid_t ds = H5Dopen2(g, n.c_str(), H5P_DEFAULT);
    if (ds < 0) continue;  // a group on the way to a dataset
    const DType dt = parse_dtype(string_attr(ds, "dtype"));
    hid_t sp = H5Dget_space(ds);
    std::vector<hsize_t> dims(static_cast<std::size_t>(H5Sget_simple_extent_ndims(sp)));
    H5Sget_simple_extent_dims(sp, dims.data(), nullptr);
    Shape shape(dims.begin(), dims.end());
    Tensor t = Tensor::empty(shape, dt);
    // Read in the file's own type: the bytes as stored (fp16/bf16 are uint16 bits).
    hid_t ft = H5Dget_type(ds), mt = H5Tget_native_type(ft, H5T_DIR_DEFAULT);
    if (t.numel()) H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw());
    H5Tclose(mt), H5Tclose(ft), H5Sclose(sp);
    f(n, ds, t);
    H5Dclose(ds);
  }
  H5Gclose(g), H5Fclose(file);
}

}  // namespace detail

// The whole tensors of the checkpoint at `path` (one file, or a manifest and its parts), by name.
inline std::map<std::string, Tensor> reference_tensors(const std::string& path) {
  std::map<std::string, Tensor> out;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const std::string parts = H5Aexists(file, "parts") > 0 ? detail::string_attr(file, "parts") : std::string();
  H5Fclose(file);
  if (parts.empty()) {
    detail::each_dataset(path, [&](const std::string& n, hid_t, const Tensor& t) { out[n] = t; });
    return out;
  }
  // Per tensor, its tensor-parallel parts (one when replicated), filled piece by piece.
  std::map<std::string, std::pair<ShardSpec, std::vector<Tensor>>> acc;
  std::map<std::string, Shape> whole_of;
  std::string line;
  for (char c : parts + "\n") {
    if (c != '\n') {
      line += c;
      continue;
    }
    if (line.empty()) continue;
    const std::string part = (std::filesystem::path(path).parent_path() / line).string();
    line.clear();
    detail::each_dataset(part, [&](const std::string& n, hid_t ds, const Tensor& piece) {
      const auto w = detail::ints_attr(ds, "whole"), sh = detail::ints_attr(ds, "shard");
      const Shape whole(w.begin(), w.end());
      const std::int64_t begin = detail::ints_attr(ds, "begin")[0];
      auto& [spec, held] = acc[n];
      whole_of[n] = whole;
      const bool sharded = sh[0] >= 0;
      if (held.empty()) {
        if (sharded) spec = make_shard(whole, static_cast<int>(sh[0]), static_cast<int>(sh[1]), 0,
                                       static_cast<int>(sh[3]));
        Shape ps = whole;
        if (sharded) ps[static_cast<std::size_t>(sh[0])] /= sh[1];
        for (int k = 0; k < (sharded ? sh[1] : 1); ++k) held.push_back(Tensor::empty(ps, piece.dtype()));
      }
      Tensor& dst = held[sharded ? static_cast<std::size_t>(sh[2]) : 0];
      std::memcpy(static_cast<char*>(dst.raw()) + begin * static_cast<std::int64_t>(dtype_size(piece.dtype())),
                  piece.raw(), piece.nbytes());
    });
  }
  for (auto& [n, sp] : acc) {
    auto& [spec, held] = sp;
    if (held.size() == 1) {
      out[n] = held[0].reshape(whole_of[n]);
      continue;
    }
    Tensor whole = Tensor::empty(whole_of[n], held[0].dtype());
    for (std::size_t k = 0; k < held.size(); ++k) {
      spec.index = static_cast<int>(k);
      place_shard(held[k], spec, whole);
    }
    out[n] = whole;
  }
  return out;
}

}  // namespace ringtrain::test_support
