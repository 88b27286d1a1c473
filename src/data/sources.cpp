#include "ringtrain/data/sources.hpp"

#include <zlib.h>

#include <filesystem>

#include "ringtrain/core/error.hpp"

namespace ringtrain::data {

std::vector<std::uint8_t> read_gz_or_raw(const std::string& path) {
  std::error_code ec;
  RT_CHECK(std::filesystem::is_regular_file(path, ec), path, ": file not found");
  gzFile f = gzopen(path.c_str(), "rb");
  RT_CHECK(f != nullptr, path, ": cannot open for reading");
  gzbuffer(f, 1 << 20);
  std::vector<std::uint8_t> out;
  std::size_t size = 0;
  for (;;) {
    if (out.size() < size + (1 << 20)) out.resize(size + (4 << 20));
    int n = gzread(f, out.data() + size, 1 << 20);
    if (n < 0) {
      int code = 0;
      std::string msg = gzerror(f, &code);
      gzclose(f);
      RT_FAIL(path, ": corrupt gzip stream (zlib: ", msg, ")");
    }
    if (n == 0) break;
    size += static_cast<std::size_t>(n);
  }
  // A gzip stream cut short reads as a clean EOF in some zlib versions: ask explicitly.
  int code = 0;
  const char* msg = gzerror(f, &code);
  std::string why = msg ? msg : "";
  gzclose(f);
  RT_CHECK(code == Z_OK || code == Z_STREAM_END, path, ": truncated or corrupt gzip stream (zlib: ", why, ")");
  out.resize(size);
  return out;
}

IdxArray read_idx(const std::string& path) {
  std::vector<std::uint8_t> b = read_gz_or_raw(path);
  RT_CHECK(b.size() >= 4, path, ": too short for an IDX header (", b.size(), " bytes)");
  RT_CHECK(b[0] == 0 && b[1] == 0, path, ": bad IDX magic (first two bytes must be 0, got ", int(b[0]), ", ",
           int(b[1]), ")");
  RT_CHECK(b[2] == 0x08, path, ": unsupported IDX element type 0x", std::hex, int(b[2]),
           " (only unsigned bytes, 0x08, are supported)");
  int nd = b[3];
  RT_CHECK(nd >= 1 && nd <= 4, path, ": IDX rank ", nd, " is not 1..4");
  std::size_t header = 4 + 4 * static_cast<std::size_t>(nd);
  RT_CHECK(b.size() >= header, path, ": truncated IDX header");
  IdxArray a;
  std::int64_t n = 1;
  for (int i = 0; i < nd; ++i) {
    const std::uint8_t* p = b.data() + 4 + 4 * i;
    std::int64_t d = (std::int64_t(p[0]) << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
    RT_CHECK(d > 0, path, ": IDX dimension ", i, " is ", d);
    a.dims.push_back(d);
    n *= d;
  }
  RT_CHECK(b.size() - header >= static_cast<std::size_t>(n), path, ": truncated IDX payload: header promises ", n,
           " bytes, file has ", b.size() - header);
  RT_CHECK(b.size() - header == static_cast<std::size_t>(n), path, ": ", b.size() - header - n,
           " trailing bytes after the IDX payload");
  a.data.assign(b.begin() + header, b.end());
  return a;
}

ImageSet read_idx_pair(const std::string& images, const std::string& labels) {
  IdxArray im = read_idx(images);
  IdxArray lb = read_idx(labels);
  RT_CHECK(im.dims.size() == 3 || im.dims.size() == 4, images, ": IDX images must have rank 3 [N,H,W] or 4 [N,C,H,W], got ",
           im.dims.size());
  RT_CHECK(lb.dims.size() == 1, labels, ": IDX labels must have rank 1 [N], got ", lb.dims.size());
  RT_CHECK(im.dims[0] == lb.dims[0], "image/label count mismatch: ", images, " has ", im.dims[0], " images but ",
           labels, " has ", lb.dims[0], " labels");
  ImageSet s;
  s.count = im.dims[0];
  s.channels = im.dims.size() == 4 ? im.dims[1] : 1;
  s.height = im.dims[im.dims.size() - 2];
  s.width = im.dims.back();
  s.pixels = std::move(im.data);
  s.labels.assign(lb.data.begin(), lb.data.end());
  s.sources = {std::filesystem::path(images).filename().string(), std::filesystem::path(labels).filename().string()};
  return s;
}

ImageSet read_cifar10(const std::vector<std::string>& batches) {
  constexpr std::size_t kImage = 3 * 32 * 32, kRecord = 1 + kImage;
  ImageSet s;
  s.channels = 3;
  s.height = s.width = 32;
  RT_CHECK(!batches.empty(), "CIFAR-10: no batch files given");
  for (const auto& path : batches) {
    std::vector<std::uint8_t> b = read_gz_or_raw(path);
    RT_CHECK(!b.empty() && b.size() % kRecord == 0, path, ": not a CIFAR-10 binary batch: ", b.size(),
             " bytes is not a multiple of the ", kRecord, "-byte record (truncated?)");
    std::size_t n = b.size() / kRecord;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint8_t* r = b.data() + i * kRecord;
      RT_CHECK(r[0] < 10, path, ": record ", i, " has label ", int(r[0]), " (CIFAR-10 labels are 0..9)");
      s.labels.push_back(r[0]);
      s.pixels.insert(s.pixels.end(), r + 1, r + kRecord);
    }
    s.count += static_cast<std::int64_t>(n);
    s.sources.push_back(std::filesystem::path(path).filename().string());
  }
  return s;
}

}  // namespace ringtrain::data
