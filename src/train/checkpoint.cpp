#include "ringtrain/train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <regex>
#include <utility>

#include "ringtrain/core/allocator.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/data/schema.hpp"
#include "checkpoint_detail.hpp"
#include "checkpoint_h5.hpp"
#include "checkpoint_parts.hpp"

namespace fs = std::filesystem;

namespace ringtrain {
namespace {

using namespace ckpt_h5;

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
  H5 file = open_checkpoint(path);
  CheckpointData out = read_head(file, path);
  const std::string where = "checkpoint '" + path + "'";
  H5 group(H5Gopen2(file, "tensors", H5P_DEFAULT), H5Gclose);
  for (const auto& name : tensor_names(file, path)) {
    H5 ds(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose);
    RT_CHECK(ds.id >= 0, where, ": cannot open tensor '", name, "'");
    const std::string tw = where + " tensor '" + name + "'";
    DatasetInfo info = read_dataset_info(ds, tw, !out.part_of.empty());
    Tensor t = Tensor::empty(info.shape, info.dtype);
    if (t.numel())
      RT_CHECK(H5Dread(ds, h5_type(info.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw()) >= 0, tw,
               ": cannot read it (truncated file?)");
    const std::uint32_t got = crc32(t.raw(), t.nbytes());
    RT_CHECK(info.crc == got, tw, " fails its checksum (crc32 ", got, ", stored ", info.crc, "): the file is corrupt");
    out.tensors.emplace_back(name, t);
    if (!out.part_of.empty()) out.places.push_back(std::move(info.place));
  }
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
    if (!selected || !ckpt_detail::is_float(t.dtype())) continue;
    std::int64_t i = ckpt_detail::first_non_finite(t.raw(), t.numel(), t.dtype());
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
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, current)) continue;
    Entry en;
    en.path = e.path().string();
    en.run_id = m[1];
    en.step = std::stoll(m[2]);
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

std::vector<std::string> checkpoint_candidates(const std::string& path) {
  std::vector<std::string> candidates;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (auto& e : CheckpointDir(path, 1).list()) candidates.push_back(e.path);
    RT_CHECK(!candidates.empty(), "no checkpoint (ckpt-<run id>-s<step>.h5) in directory '", path, "'");
  } else {
    RT_CHECK(fs::exists(path, ec), "checkpoint '", path, "' does not exist");
    candidates.push_back(path);
  }
  return candidates;
}

FoundCheckpoint find_intact_checkpoint(const std::string& path,
                                       const std::function<void(const CheckpointData&)>& accept) {
  FoundCheckpoint f;
  const std::vector<std::string> candidates = checkpoint_candidates(path);
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
