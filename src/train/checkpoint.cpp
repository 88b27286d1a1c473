#include "ringtrain/train/checkpoint.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <regex>
#include <utility>

#include "ringtrain/core/allocator.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/data/schema.hpp"
#include "checkpoint_parts.hpp"

namespace fs = std::filesystem;

namespace ringtrain {
namespace {

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
  std::size_t n = H5Tget_size(type);
  std::string s(n, '\0');
  H5 mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem, n);
  RT_CHECK(H5Aread(attr, mem, s.data()) >= 0, where, ": cannot read attribute '", name, "'");
  s.resize(std::strlen(s.c_str()));
  return s;
}

std::int64_t read_int_attr(hid_t obj, const char* name, const std::string& where) {
  RT_CHECK(H5Aexists(obj, name) > 0, where, ": attribute '", name, "' is missing");
  H5 attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  std::int64_t v = 0;
  RT_CHECK(H5Aread(attr, H5T_NATIVE_INT64, &v) >= 0, where, ": cannot read attribute '", name, "'");
  return v;
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Free space, for the "disk full?" hint of a failed write.
std::string space_hint(const fs::path& dir) {
  std::error_code ec;
  auto s = fs::space(dir.empty() ? fs::path(".") : dir, ec);
  if (ec) return "";
  return cat(" (", s.available / 1024, " KiB free on '", dir.string(), "')");
}

void write_tensors(hid_t file, const std::string& path, const CheckpointData& data,
                   const std::vector<std::uint32_t>& crcs, const CheckpointWriteHook& hook);

// Builds the HDF5 file in memory (the core driver, no backing store) and
// returns its bytes. HDF5 never touches the disk: a full disk is a plain
// write() error below, and HDF5 is not left holding a half-flushed file.
std::vector<char> build_image(const std::string& path, const CheckpointData& data,
                              const std::vector<std::uint32_t>& crcs, const CheckpointWriteHook& hook) {
  std::vector<char> image;
  H5 fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_core(fapl, 1 << 20, 0);
  {
    H5 file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), H5Fclose);
    RT_CHECK(file.id >= 0, "checkpoint '", path, "': cannot create the HDF5 image in memory");
    write_tensors(file, path, data, crcs, hook);
    RT_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL) >= 0, "checkpoint '", path, "': HDF5 flush failed");
    ssize_t n = H5Fget_file_image(file, nullptr, 0);
    RT_CHECK(n > 0, "checkpoint '", path, "': cannot get the HDF5 image");
    image.resize(static_cast<std::size_t>(n));
    RT_CHECK(H5Fget_file_image(file, image.data(), image.size()) == n, "checkpoint '", path,
             "': cannot copy the HDF5 image");
  }
  return image;
}

// write() everything, then fsync; errno in the message (ENOSPC: "No space left on device").
void write_bytes(const std::string& tmp, const std::string& path, const std::vector<char>& bytes) {
  const fs::path parent = fs::path(path).parent_path();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  RT_CHECK(fd >= 0, "checkpoint '", path, "': cannot create '", tmp, "': ", std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : ENOSPC;
      ::close(fd);
      RT_FAIL("checkpoint '", path, "': writing ", bytes.size(), " bytes failed after ", done, ": ", std::strerror(e),
              space_hint(parent));
    }
    done += static_cast<std::size_t>(w);
  }
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  RT_CHECK(rc == 0, "checkpoint '", path, "': fsync failed: ", std::strerror(e), space_hint(parent));
}

void write_tensors(hid_t file, const std::string& path, const CheckpointData& data,
                   const std::vector<std::uint32_t>& crcs, const CheckpointWriteHook& hook) {
  const bool part = !data.part_of.empty();
  RT_CHECK(data.places.empty() || data.places.size() == data.tensors.size(), "checkpoint '", path, "': ",
           data.places.size(), " places for ", data.tensors.size(), " tensors");
  write_string_attr(file, "schema", part ? kCheckpointPartSchema : kCheckpointSchema);
  write_string_attr(file, "config", data.config_toml);
  if (part) write_string_attr(file, "part_of", data.part_of);
  if (!data.parts.empty()) {
    std::string names;
    for (const auto& p : data.parts) names += p + "\n";
    write_string_attr(file, "parts", names);
  }
  H5 lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl, 1);
  H5 group(H5Gcreate2(file, "tensors", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  for (std::size_t i = 0; i < data.tensors.size(); ++i) {
    const auto& [name, t] = data.tensors[i];
    Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
    std::vector<hsize_t> dims;
    for (auto d : host.shape()) dims.push_back(static_cast<hsize_t>(d));
    if (dims.empty()) dims.push_back(static_cast<hsize_t>(host.numel()));
    H5 space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
    H5 ds(H5Dcreate2(group, name.c_str(), h5_type(host.dtype()), space, lcpl, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
    RT_CHECK(ds.id >= 0, "checkpoint '", path, "': cannot create dataset for tensor '", name, "'");
    if (host.numel())
      RT_CHECK(H5Dwrite(ds, h5_type(host.dtype()), H5S_ALL, H5S_ALL, H5P_DEFAULT, host.raw()) >= 0,
               "checkpoint '", path, "': cannot write tensor '", name, "'");
    write_string_attr(ds, "dtype", dtype_name(host.dtype()));
    write_int_attr(ds, "crc32", crcs[i]);
    if (!data.places.empty()) {
      const PiecePlace& pl = data.places[i];
      write_ints_attr(ds, "whole", std::vector<std::int64_t>(pl.whole.begin(), pl.whole.end()));
      write_ints_attr(ds, "shard", {pl.shard.dim, pl.shard.parts, pl.shard.index, pl.shard.blocks});
      write_int_attr(ds, "begin", pl.begin);
    }
    if (hook) hook(name);
  }
  H5 scalars(H5Gcreate2(file, "scalars", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  for (const auto& [name, v] : data.scalars) write_int_attr(scalars, name.c_str(), v);
  H5 strings(H5Gcreate2(file, "strings", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  for (const auto& [name, v] : data.strings) write_string_attr(strings, name.c_str(), v);
}

herr_t collect_link(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

bool is_float(DType dt) { return dt == DType::f32 || dt == DType::f64 || dt == DType::f16 || dt == DType::bf16; }

// Index of the first non-finite element, or -1.
std::int64_t first_non_finite(const Tensor& t) {
  const std::int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::f32: {
      const float* p = static_cast<const float*>(t.raw());
      for (std::int64_t i = 0; i < n; ++i) if (!std::isfinite(p[i])) return i;
      return -1;
    }
    case DType::f64: {
      const double* p = static_cast<const double*>(t.raw());
      for (std::int64_t i = 0; i < n; ++i) if (!std::isfinite(p[i])) return i;
      return -1;
    }
    case DType::f16:
    case DType::bf16: {
      const std::uint16_t mask = t.dtype() == DType::f16 ? 0x7c00 : 0x7f80;
      const std::uint16_t* p = static_cast<const std::uint16_t*>(t.raw());
      for (std::int64_t i = 0; i < n; ++i) if ((p[i] & mask) == mask) return i;
      return -1;
    }
    default: return -1;
  }
}

}  // namespace

std::uint32_t crc32(const void* data, std::size_t bytes, std::uint32_t crc) {
  // zlib's (the same IEEE CRC-32): several GB/s, so a large state's checksum is not the write's bottleneck.
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (bytes > 0) {
    const uInt n = static_cast<uInt>(std::min<std::size_t>(bytes, 1u << 30));
    c = ::crc32(c, p, n);
    p += n;
    bytes -= n;
  }
  return static_cast<std::uint32_t>(c);
}

void write_checkpoint(const std::string& path, const CheckpointData& data, const CheckpointWriteHook& hook) {
  // Checksums before taking the HDF5 lock: it also stalls the loader's reads.
  std::vector<std::uint32_t> crcs;
  for (const auto& [name, t] : data.tensors) {
    Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
    crcs.push_back(crc32(host.raw(), host.nbytes()));
  }
  std::vector<char> image;
  {
    // HDF5 1.10 is not thread-safe and the loader's prefetch thread reads concurrently.
    std::lock_guard lock(data::hdf5_mutex());
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    image = build_image(path, data, crcs, hook);
  }
  fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    write_bytes(tmp, path, image);
    std::error_code ec;
    fs::rename(tmp, path, ec);
    RT_CHECK(!ec, "checkpoint '", path, "': rename from temporary file failed: ", ec.message());
  } catch (...) {
    // A failed write (disk full, I/O error) must not leave its partial file behind.
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  fsync_path(target.has_parent_path() ? target.parent_path().string() : ".", true);
}

CheckpointData read_checkpoint(const std::string& path) {
  CheckpointData d = read_checkpoint_file(path);
  RT_CHECK(d.part_of.empty(), "checkpoint '", path, "' is one rank's part of the parallel checkpoint '", d.part_of,
           "' (in the same directory): resume from that file or from the directory");
  if (!d.parts.empty()) {
    assemble_parts(path, d);
    d.parts.clear();  // whole tensors now: written back, it is one file
  }
  return d;
}

CheckpointData read_checkpoint_file(const std::string& path) {
  std::lock_guard lock(data::hdf5_mutex());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  RT_CHECK(fs::exists(path), "checkpoint '", path, "' does not exist");
  H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  RT_CHECK(file.id >= 0, "checkpoint '", path, "' is not a readable HDF5 file (truncated or corrupt?)");
  const std::string where = "checkpoint '" + path + "'";
  std::string schema = read_string_attr(file, "schema", where);
  RT_CHECK(schema == kCheckpointSchema || schema == kCheckpointPartSchema, where, " has schema '", schema, "', but this ringtrain reads '",
           kCheckpointSchema, "' only (",
           schema == "ringtrain-checkpoint-1" ? "written by an older ringtrain with flat per-dtype tensors and no "
                                                "checksums; start a new run"
                                              : "not a ringtrain checkpoint of this version",
           ")");
  CheckpointData out;
  out.config_toml = read_string_attr(file, "config", where);
  if (schema == kCheckpointPartSchema) out.part_of = read_string_attr(file, "part_of", where);
  if (H5Aexists(file, "parts") > 0) {
    std::string names = read_string_attr(file, "parts", where), line;
    for (char c : names)
      if (c != '\n') line += c;
      else if (!line.empty()) out.parts.push_back(std::exchange(line, std::string()));
    RT_CHECK(!out.parts.empty(), where, ": its attribute 'parts' names no part file");
  }

  RT_CHECK(H5Lexists(file, "tensors", H5P_DEFAULT) > 0, where, " has no /tensors group");
  H5 group(H5Gopen2(file, "tensors", H5P_DEFAULT), H5Gclose);
  std::vector<std::string> links;
  RT_CHECK(H5Lvisit(group, H5_INDEX_NAME, H5_ITER_INC, collect_link, &links) >= 0, where,
           ": cannot list its tensors (corrupt file?)");
  for (const auto& name : links) {
    H5 obj(H5Oopen(group, name.c_str(), H5P_DEFAULT), H5Oclose);
    RT_CHECK(obj.id >= 0, where, ": cannot open '", name, "' (corrupt file?)");
    if (H5Iget_type(obj) != H5I_DATASET) continue;
    H5 ds(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose);
    RT_CHECK(ds.id >= 0, where, ": cannot open tensor '", name, "'");
    const std::string tw = where + " tensor '" + name + "'";
    DType dt = parse_dtype(read_string_attr(ds, "dtype", tw));
    H5 space(H5Dget_space(ds), H5Sclose);
    int nd = H5Sget_simple_extent_ndims(space);
    RT_CHECK(nd >= 1 && nd <= 8, tw, " has ", nd, " dimensions");
    std::vector<hsize_t> dims(static_cast<std::size_t>(nd));
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    Shape shape;
    for (auto d : dims) shape.push_back(static_cast<std::int64_t>(d));
    Tensor t = Tensor::empty(shape, dt);
    if (t.numel())
      RT_CHECK(H5Dread(ds, h5_type(dt), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw()) >= 0, tw,
               ": cannot read it (truncated file?)");
    std::int64_t want = read_int_attr(ds, "crc32", tw);
    std::uint32_t got = crc32(t.raw(), t.nbytes());
    RT_CHECK(static_cast<std::uint32_t>(want) == got, tw, " fails its checksum (crc32 ", got, ", stored ", want,
             "): the file is corrupt");
    out.tensors.emplace_back(name, t);
    if (!out.part_of.empty()) {
      PiecePlace pl;
      for (auto d : read_ints_attr(ds, "whole", tw)) pl.whole.push_back(d);
      const auto sh = read_ints_attr(ds, "shard", tw);
      RT_CHECK(sh.size() == 4, tw, ": attribute 'shard' has ", sh.size(), " values, not 4");
      pl.shard.dim = static_cast<int>(sh[0]);
      pl.shard.parts = static_cast<int>(sh[1]);
      pl.shard.index = static_cast<int>(sh[2]);
      pl.shard.blocks = static_cast<int>(sh[3]);
      if (pl.shard.sharded()) pl.shard.global = pl.whole;
      pl.begin = read_int_attr(ds, "begin", tw);
      out.places.push_back(std::move(pl));
    }
  }
  auto read_attrs = [&](const char* grp, auto&& each) {
    if (H5Lexists(file, grp, H5P_DEFAULT) <= 0) return;
    H5 g(H5Gopen2(file, grp, H5P_DEFAULT), H5Gclose);
    int na = H5Aget_num_attrs(g);
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

void restore_tensor(const CheckpointData& ckpt, const std::string& name, Tensor dst) {
  for (const auto& [n, t] : ckpt.tensors) {
    if (n != name) continue;
    const bool same_shape = t.shape() == dst.shape() || (t.numel() == dst.numel() && t.shape().size() == 1 &&
                                                         dst.shape().size() <= 1);
    RT_CHECK(t.dtype() == dst.dtype() && same_shape, "checkpoint tensor '", name, "' is ", dtype_name(t.dtype()),
             " ", shape_str(t.shape()), ", but the model expects ", dtype_name(dst.dtype()), " ",
             shape_str(dst.shape()), " (was it written for another model?)");
    copy_bytes(dst.raw(), dst.device(), t.raw(), t.device(), t.nbytes());
    return;
  }
  RT_FAIL("checkpoint has no tensor '", name, "' (was it written for another model or optimizer?)");
}

void check_finite(const CheckpointData& ckpt, const std::string& path, const std::vector<std::string>& prefixes) {
  for (const auto& [name, t] : ckpt.tensors) {
    bool selected = false;
    for (const auto& p : prefixes) selected |= name.rfind(p, 0) == 0;
    if (!selected || !is_float(t.dtype())) continue;
    std::int64_t i = first_non_finite(t);
    RT_CHECK(i < 0, "checkpoint '", path, "': tensor '", name, "' holds NaN or Inf (element ", i,
             "): the run had diverged when it was written; resume from an earlier checkpoint");
  }
}

std::vector<std::string> checkpoint_files(const std::string& path) {
  std::vector<std::string> out = {path};
  const fs::path p(path);
  const std::string stem = p.stem().string() + ".part-";
  std::error_code ec;
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(stem, 0) == 0 && e.path().extension() == ".h5") out.push_back(e.path().string());
  std::sort(out.begin() + 1, out.end());
  return out;
}

// ---- directory ----------------------------------------------------------------

CheckpointDir::CheckpointDir(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

std::vector<CheckpointDir::Entry> CheckpointDir::list() const {
  std::vector<Entry> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  static const std::regex current("ckpt-([A-Za-z0-9]+-[A-Za-z0-9]+-[A-Za-z0-9]+)-s([0-9]+)\\.h5");
  static const std::regex old("ckpt-([0-9]+)\\.h5");
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    Entry en;
    en.path = e.path().string();
    if (std::regex_match(name, m, current)) {
      en.run_id = m[1];
      en.step = std::stoll(m[2]);
    } else if (std::regex_match(name, m, old)) {
      en.step = std::stoll(m[1]);
    } else {
      continue;
    }
    en.mtime = fs::last_write_time(e.path(), ec);
    out.push_back(en);
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.mtime != b.mtime ? a.mtime > b.mtime : a.step > b.step;
  });
  return out;
}

std::string CheckpointDir::path_for(const std::string& run_id, std::int64_t step) const {
  RT_CHECK(!run_id.empty(), "CheckpointDir::save needs a run id");
  char name[128];
  std::snprintf(name, sizeof name, "ckpt-%s-s%09lld.h5", run_id.c_str(), static_cast<long long>(step));
  return (fs::path(dir_) / name).string();
}

std::string CheckpointDir::part_path_for(const std::string& run_id, std::int64_t step, int rank, int ranks) const {
  std::string m = path_for(run_id, step);
  char tail[64];
  std::snprintf(tail, sizeof tail, ".part-%05d-of-%05d.h5", rank, ranks);
  return m.substr(0, m.size() - 3) + tail;
}

std::string CheckpointDir::save(const std::string& run_id, std::int64_t step, const CheckpointData& data,
                                const CheckpointWriteHook& hook) const {
  const std::string path = path_for(run_id, step);
  write_checkpoint(path, data, hook);
  // Rotation within this run only, by step (the newest `keep` survive).
  std::vector<Entry> mine;
  for (auto& e : list())
    if (e.run_id == run_id) mine.push_back(e);
  std::sort(mine.begin(), mine.end(), [](const Entry& a, const Entry& b) { return a.step > b.step; });
  for (std::size_t i = static_cast<std::size_t>(keep_); i < mine.size(); ++i) {
    // A parallel checkpoint's parts go with their manifest (the manifest first: never a manifest without parts).
    std::error_code ec;
    for (const auto& f : checkpoint_files(mine[i].path)) fs::remove(f, ec);
  }
  return path;
}

std::string CheckpointDir::latest() const {
  auto all = list();
  return all.empty() ? std::string() : all.front().path;
}

int CheckpointDir::remove_stale_temps(const std::string& run_id) const {
  int n = 0;
  std::error_code ec;
  if (run_id.empty() || !fs::is_directory(dir_, ec)) return 0;
  const std::string prefix = "ckpt-" + run_id + "-";
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const auto part = name.find(".part-");
    if (name.find(".h5.tmp.") != std::string::npos ||
        (part != std::string::npos && !fs::exists(fs::path(dir_) / (name.substr(0, part) + ".h5"), ec)))
      stale.push_back(e.path());
  }
  for (const auto& p : stale) n += fs::remove(p, ec);
  return n;
}

FoundCheckpoint find_intact_checkpoint(const std::string& path,
                                       const std::function<void(const CheckpointData&)>& accept) {
  FoundCheckpoint f;
  std::vector<std::string> candidates;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (auto& e : CheckpointDir(path, 1).list()) candidates.push_back(e.path);
    RT_CHECK(!candidates.empty(), "no checkpoint (ckpt-*.h5) in directory '", path, "'");
  } else {
    RT_CHECK(fs::exists(path, ec), "checkpoint '", path, "' does not exist");
    candidates.push_back(path);
  }
  for (const auto& c : candidates) {
    try {
      CheckpointData d = read_checkpoint(c);
      check_finite(d, c, {"param/", "buffer/", "optim/"});
      if (accept) accept(d);
      f.path = c;
      f.data = std::move(d);
      return f;
    } catch (const Error& e) {
      f.skipped.push_back(cat(c, ": ", e.what()));
    }
  }
  std::string all;
  for (auto& s : f.skipped) all += "\n  " + s;
  RT_FAIL("no usable checkpoint in '", path, "':", all);
}

}  // namespace ringtrain
