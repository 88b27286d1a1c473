// The one writer: a checkpoint file (one file, a part file or a manifest) built
// in memory by HDF5, then written to a temporary file, fsynced and renamed.
#include "ringtrain/checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "ringtrain/core/allocator.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/data/schema.hpp"
#include "h5.hpp"

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

std::vector<char> checkpoint_image(const std::string& path, const CheckpointData& data,
                                   const CheckpointWriteHook& hook) {
  // Checksums before taking the HDF5 lock: it also stalls the loader's reads.
  std::vector<std::uint32_t> crcs;
  for (const auto& [name, t] : data.tensors) {
    Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
    crcs.push_back(crc32(host.raw(), host.nbytes()));
  }
  // HDF5 1.10 is not thread-safe and the loader's prefetch thread reads concurrently.
  std::lock_guard lock(data::hdf5_mutex());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  return build_image(path, data, crcs, hook);
}

void write_file_atomic(const std::string& path, const std::vector<char>& bytes, bool sync_dir) {
  fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    write_bytes(tmp, path, bytes);
    std::error_code ec;
    fs::rename(tmp, path, ec);
    RT_CHECK(!ec, "checkpoint '", path, "': rename from temporary file failed: ", ec.message());
  } catch (...) {
    // A failed write (disk full, I/O error) must not leave its partial file behind.
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  if (sync_dir) fsync_path(target.has_parent_path() ? target.parent_path().string() : ".", true);
}

void write_checkpoint(const std::string& path, const CheckpointData& data, const CheckpointWriteHook& hook) {
  write_file_atomic(path, checkpoint_image(path, data, hook), true);
}

}  // namespace ringtrain
