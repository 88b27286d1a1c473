#include "h5.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "ringtrain/core/error.hpp"

namespace fs = std::filesystem;

namespace ringtrain::ckpt_h5 {

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

void write_int_attr(hid_t obj, const char* name, std::int64_t v) {
  H5 space(H5Screate(H5S_SCALAR), H5Sclose);
  H5 attr(H5Acreate2(obj, name, H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  RT_CHECK(attr.id >= 0 && H5Awrite(attr, H5T_NATIVE_INT64, &v) >= 0, "cannot write attribute '", name, "'");
}

void write_ints_attr(hid_t obj, const char* name, const std::vector<std::int64_t>& v) {
  const hsize_t n = std::max<std::size_t>(1, v.size());
  std::vector<std::int64_t> data = v.empty() ? std::vector<std::int64_t>{0} : v;
  H5 space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5 attr(H5Acreate2(obj, name, H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  RT_CHECK(attr.id >= 0 && H5Awrite(attr, H5T_NATIVE_INT64, data.data()) >= 0, "cannot write attribute '", name, "'");
}

std::vector<std::int64_t> read_ints_attr(hid_t obj, const char* name, const std::string& where) {
  RT_CHECK(H5Aexists(obj, name) > 0, where, ": attribute '", name, "' is missing");
  H5 attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  H5 space(H5Aget_space(attr), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  RT_CHECK(n >= 1 && n <= 16, where, ": attribute '", name, "' has ", n, " values");
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  RT_CHECK(H5Aread(attr, H5T_NATIVE_INT64, v.data()) >= 0, where, ": cannot read attribute '", name, "'");
  return v;
}

std::string read_string_attr(hid_t obj, const char* name, const std::string& where) {
  RT_CHECK(H5Aexists(obj, name) > 0, where, ": attribute '", name, "' is missing");
  H5 attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  H5 type(H5Aget_type(attr), H5Tclose);
  RT_CHECK(H5Tget_class(type) == H5T_STRING, where, ": attribute '", name, "' is not text");
  std::size_t n = H5Tget_size(type);
  std::string s(n, '\0');
  H5 mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem, n);
  RT_CHECK(H5Aread(attr, mem, s.data()) >= 0, where, ": cannot read attribute '", name, "'");
  s.resize(std::strlen(s.c_str()));
  return s;
}

std::int64_t read_int_attr(hid_t obj, const char* name, const std::string& where) {
  return read_ints_attr(obj, name, where).front();  // a scalar attribute holds one value
}

H5 open_checkpoint(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  std::error_code ec;
  RT_CHECK(fs::exists(path, ec), "checkpoint '", path, "' does not exist");
  H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  RT_CHECK(file.id >= 0, "checkpoint '", path, "' is not a readable HDF5 file (truncated or corrupt?)");
  RT_CHECK(H5Aexists(file, "schema") > 0, "checkpoint '", path,
           "' is an HDF5 file but not a ringtrain checkpoint (it has no 'schema' attribute)");
  const std::string schema = read_string_attr(file, "schema", "checkpoint '" + path + "'");
  RT_CHECK(schema == kCheckpointSchema || schema == kCheckpointPartSchema, "checkpoint '", path, "' has schema '",
           schema, "': it is not a ringtrain checkpoint of this version (this ringtrain reads '", kCheckpointSchema,
           "' and its parts '", kCheckpointPartSchema, "')");
  return file;
}

CheckpointData read_head(hid_t file, const std::string& path) {
  const std::string where = "checkpoint '" + path + "'";
  CheckpointData out;
  out.config_toml = read_string_attr(file, "config", where);
  if (read_string_attr(file, "schema", where) == kCheckpointPartSchema)
    out.part_of = read_string_attr(file, "part_of", where);
  if (H5Aexists(file, "parts") > 0) {
    std::string names = read_string_attr(file, "parts", where), line;
    for (char c : names)
      if (c != '\n') line += c;
      else if (!line.empty()) out.parts.push_back(std::exchange(line, std::string()));
    RT_CHECK(!out.parts.empty(), where, ": its attribute 'parts' names no part file");
  }
  auto read_attrs = [&](const char* grp, auto&& each) {
    if (H5Lexists(file, grp, H5P_DEFAULT) <= 0) return;
    H5 g(H5Gopen2(file, grp, H5P_DEFAULT), H5Gclose);
    const int na = H5Aget_num_attrs(g);
    for (int i = 0; i < na; ++i) {
      H5 attr(H5Aopen_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, static_cast<hsize_t>(i), H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose);
      char name[256];
      H5Aget_name(attr, sizeof name, name);
      each(g, std::string(name));
    }
  };
  read_attrs("scalars", [&](hid_t g, const std::string& n) { out.scalars[n] = read_int_attr(g, n.c_str(), where); });
  read_attrs("strings", [&](hid_t g, const std::string& n) { out.strings[n] = read_string_attr(g, n.c_str(), where); });
  return out;
}

namespace {
herr_t collect_link(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> tensor_names(hid_t file, const std::string& path) {
  const std::string where = "checkpoint '" + path + "'";
  RT_CHECK(H5Lexists(file, "tensors", H5P_DEFAULT) > 0, where, " has no /tensors group");
  H5 group(H5Gopen2(file, "tensors", H5P_DEFAULT), H5Gclose);
  std::vector<std::string> links, out;
  RT_CHECK(H5Lvisit(group, H5_INDEX_NAME, H5_ITER_INC, collect_link, &links) >= 0, where,
           ": cannot list its tensors (corrupt file?)");
  for (const auto& name : links) {
    H5 obj(H5Oopen(group, name.c_str(), H5P_DEFAULT), H5Oclose);
    RT_CHECK(obj.id >= 0, where, ": cannot open '", name, "' (corrupt file?)");
    if (H5Iget_type(obj) == H5I_DATASET) out.push_back(name);
  }
  return out;
}

DatasetInfo read_dataset_info(hid_t ds, const std::string& tw, bool part) {
  DatasetInfo d;
  d.dtype = parse_dtype(read_string_attr(ds, "dtype", tw));
  H5 space(H5Dget_space(ds), H5Sclose);
  const int nd = H5Sget_simple_extent_ndims(space);
  RT_CHECK(nd >= 1 && nd <= 8, tw, " has ", nd, " dimensions");
  std::vector<hsize_t> dims(static_cast<std::size_t>(nd));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  for (auto n : dims) d.shape.push_back(static_cast<std::int64_t>(n));
  d.crc = static_cast<std::uint32_t>(read_int_attr(ds, "crc32", tw));
  if (part) {
    RT_CHECK(nd == 1, tw, " is a piece of ", nd, " dimensions, not 1");
    for (auto n : read_ints_attr(ds, "whole", tw)) d.place.whole.push_back(n);
    const auto sh = read_ints_attr(ds, "shard", tw);
    RT_CHECK(sh.size() == 4, tw, ": attribute 'shard' has ", sh.size(), " values, not 4");
    d.place.shard.dim = static_cast<int>(sh[0]);
    d.place.shard.parts = static_cast<int>(sh[1]);
    d.place.shard.index = static_cast<int>(sh[2]);
    d.place.shard.blocks = static_cast<int>(sh[3]);
    if (d.place.shard.sharded()) d.place.shard.global = d.place.whole;
    d.place.begin = read_int_attr(ds, "begin", tw);
  } else {
    d.place.whole = d.shape;
  }
  // Raw bytes at a file offset: a contiguous dataset of this machine's type, in a file without a user block.
  H5 type(H5Dget_type(ds), H5Tclose);
  H5 dcpl(H5Dget_create_plist(ds), H5Pclose);
  H5 file(H5Iget_file_id(ds), H5Fclose);
  H5 fcpl(H5Fget_create_plist(file), H5Pclose);
  hsize_t userblock = 1;
  H5Pget_userblock(fcpl, &userblock);
  const haddr_t at = H5Dget_offset(ds);
  if (H5Pget_layout(dcpl) == H5D_CONTIGUOUS && H5Pget_external_count(dcpl) == 0 && userblock == 0 &&
      H5Tequal(type, h5_type(d.dtype)) > 0 && at != HADDR_UNDEF)
    d.offset = static_cast<std::int64_t>(at);
  return d;
}

}  // namespace ringtrain::ckpt_h5
