#pragma once
// Fixtures for the data tests, generated at run time in a temp directory:
// IDX/CIFAR byte files, and HDF5 files written with the raw HDF5 C API (an
// independent path from ringtrain's writer, also used to build broken files).
#include <hdf5.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace rtfix {

namespace fs = std::filesystem;

// A fresh directory under /tmp, removed when the object dies.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("rt_data_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& n) const { return (path / n).string(); }
};

inline void write_bytes(const std::string& path, const std::vector<std::uint8_t>& b, bool gz) {
  if (gz) {
    gzFile f = gzopen(path.c_str(), "wb6");
    gzwrite(f, b.data(), unsigned(b.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  }
}

// Whole file through zlib (the test's own reader, independent of ringtrain's).
inline std::vector<std::uint8_t> gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  int n;
  while (f && (n = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  if (f) gzclose(f);
  return out;
}

inline std::vector<std::uint8_t> idx_header(std::uint8_t type, std::vector<std::uint32_t> dims) {
  std::vector<std::uint8_t> h = {0, 0, type, std::uint8_t(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) h.push_back(std::uint8_t(d >> s));
  return h;
}

// A small IDX pair: image i pixel j = (i * 7 + j * 3) % 256, label i % classes.
inline void write_idx_pair(const std::string& images, const std::string& labels, std::uint32_t n, std::uint32_t h,
                           std::uint32_t w, bool gz, int classes = 10) {
  auto im = idx_header(0x08, {n, h, w});
  for (std::uint32_t i = 0; i < n; ++i)
    for (std::uint32_t j = 0; j < h * w; ++j) im.push_back(std::uint8_t((i * 7 + j * 3) % 256));
  auto lb = idx_header(0x08, {n});
  for (std::uint32_t i = 0; i < n; ++i) lb.push_back(std::uint8_t(i % classes));
  write_bytes(images, im, gz);
  write_bytes(labels, lb, gz);
}

// Raw HDF5 helpers for reading back and for building (possibly broken) files.
inline std::vector<std::uint8_t> h5_read_u8(const std::string& path, const char* name) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  hid_t s = H5Dget_space(d);
  std::vector<std::uint8_t> v(std::size_t(H5Sget_simple_extent_npoints(s)));
  H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Sclose(s), H5Dclose(d), H5Fclose(f);
  return v;
}
inline std::vector<std::int64_t> h5_read_i64(const std::string& path, const char* name) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  hid_t s = H5Dget_space(d);
  std::vector<std::int64_t> v(std::size_t(H5Sget_simple_extent_npoints(s)));
  H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Sclose(s), H5Dclose(d), H5Fclose(f);
  return v;
}
inline std::vector<double> h5_read_attr_f64(const std::string& path, const char* name) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  hid_t s = H5Aget_space(a);
  std::vector<double> v(std::size_t(H5Sget_simple_extent_npoints(s)));
  H5Aread(a, H5T_NATIVE_DOUBLE, v.data());
  H5Sclose(s), H5Aclose(a), H5Fclose(f);
  return v;
}

// Copies `src` to `dst` keeping only the first `keep` bytes (a truncated file).
inline void truncate_copy(const std::string& src, const std::string& dst, std::uintmax_t keep) {
  fs::copy_file(src, dst, fs::copy_options::overwrite_existing);
  fs::resize_file(dst, keep);
}

}  // namespace rtfix
