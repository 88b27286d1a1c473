// The user's own data for `ringtrain prepare`: NumPy .npz archives (libzip
// opens the zip, the .npy headers are parsed here) and folders of PNG/JPEG
// images, one folder per class (libpng's simplified API and libjpeg-turbo
// decode). Same rule as sources.cpp: every malformed input is an Error naming
// the file (and the array or image) and what is wrong.
#include <algorithm>
#include <csetjmp>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "ringtrain/core/error.hpp"
#include "ringtrain/data/sources.hpp"

// jpeglib.h needs size_t and FILE declared before it.
#include <jpeglib.h>
#include <png.h>
#include <zip.h>

namespace ringtrain::data {
namespace {
namespace fs = std::filesystem;

}  // namespace

// `what` is "FILE.npz: x_train".
Npy parse_npy(const std::vector<std::uint8_t>& b, const std::string& what) {
  RT_CHECK(b.size() >= 10 && std::memcmp(b.data(), "\x93NUMPY", 6) == 0, what, ": not a .npy array (bad magic)");
  const int major = b[6];
  RT_CHECK(major >= 1 && major <= 3, what, ": unsupported .npy version ", major);
  std::size_t hlen = 0, start = 0;
  if (major == 1) hlen = b[8] | (std::size_t(b[9]) << 8), start = 10;
  else {
    RT_CHECK(b.size() >= 12, what, ": truncated .npy header");
    hlen = b[8] | (std::size_t(b[9]) << 8) | (std::size_t(b[10]) << 16) | (std::size_t(b[11]) << 24), start = 12;
  }
  RT_CHECK(start + hlen <= b.size(), what, ": truncated .npy header");
  const std::string h(b.begin() + std::ptrdiff_t(start), b.begin() + std::ptrdiff_t(start + hlen));
  auto value_of = [&](const char* key) {
    const auto k = h.find(std::string("'") + key + "'");
    RT_CHECK(k != std::string::npos, what, ": .npy header has no '", key, "': ", h);
    auto c = h.find(':', k);
    RT_CHECK(c != std::string::npos, what, ": malformed .npy header: ", h);
    return h.substr(c + 1);
  };
  Npy n;
  std::string d = value_of("descr");
  const auto q1 = d.find('\''), q2 = d.find('\'', q1 + 1);
  RT_CHECK(q1 != std::string::npos && q2 != std::string::npos, what, ": malformed 'descr' in .npy header: ", h);
  n.descr = d.substr(q1 + 1, q2 - q1 - 1);
  RT_CHECK(value_of("fortran_order").find("False") < value_of("fortran_order").find_first_of(",}"), what,
           ": Fortran-ordered arrays are not supported (save np.ascontiguousarray(a))");
  std::string s = value_of("shape");
  const auto p1 = s.find('('), p2 = s.find(')');
  RT_CHECK(p1 != std::string::npos && p2 != std::string::npos, what, ": malformed 'shape' in .npy header: ", h);
  std::string dims = s.substr(p1 + 1, p2 - p1 - 1);
  std::int64_t numel = 1;
  for (std::size_t i = 0; i < dims.size();) {
    while (i < dims.size() && (dims[i] == ' ' || dims[i] == ',')) ++i;
    if (i >= dims.size()) break;
    std::size_t used = 0;
    n.shape.push_back(std::stoll(dims.substr(i), &used));
    numel *= n.shape.back();
    i += used;
  }
  const std::size_t item = n.descr.size() >= 3 ? std::size_t(std::stoi(n.descr.substr(2))) : 0;
  RT_CHECK(item > 0 && (n.descr[0] == '|' || n.descr[0] == '<'), what, ": dtype '", n.descr,
           "' is not supported (little-endian integers only)");
  const std::size_t want = std::size_t(numel) * item;
  RT_CHECK(b.size() - start - hlen == want, what, ": payload has ", b.size() - start - hlen, " bytes, shape ",
           dims, " of ", n.descr, " needs ", want);
  n.bytes.assign(b.begin() + std::ptrdiff_t(start + hlen), b.end());
  return n;
}

namespace {

std::vector<std::uint8_t> zip_member(zip_t* z, const std::string& file, const std::string& member) {
  const zip_int64_t i = zip_name_locate(z, (member + ".npy").c_str(), 0);
  RT_CHECK(i >= 0, file, ": no array '", member, "' (the .npz needs x_train, y_train, x_test, y_test)");
  zip_stat_t st;
  RT_CHECK(zip_stat_index(z, zip_uint64_t(i), 0, &st) == 0 && (st.valid & ZIP_STAT_SIZE), file, ": cannot stat '",
           member, "': ", zip_strerror(z));
  std::unique_ptr<zip_file_t, int (*)(zip_file_t*)> f(zip_fopen_index(z, zip_uint64_t(i), 0), zip_fclose);
  RT_CHECK(f != nullptr, file, ": cannot read '", member, "': ", zip_strerror(z));
  std::vector<std::uint8_t> out(st.size);
  RT_CHECK(zip_fread(f.get(), out.data(), st.size) == zip_int64_t(st.size), file, ": '", member, "' is truncated");
  return out;
}

// x: uint8 [N, H, W] (C = 1), [N, H, W, C] with C <= 4 (channels last), or [N, C, H, W].
ImageSet images_of(const Npy& x, const Npy& y, const std::string& what_x, const std::string& what_y) {
  RT_CHECK(x.descr == "|u1", what_x, ": dtype '", x.descr, "' must be uint8 ('|u1'): scale to 0..255 and use "
           "x.astype(np.uint8)");
  RT_CHECK(x.shape.size() == 3 || x.shape.size() == 4, what_x, ": shape must be [N, H, W], [N, H, W, C] or "
           "[N, C, H, W], has rank ", x.shape.size());
  ImageSet s;
  s.count = x.shape[0];
  const bool last = x.shape.size() == 4 && x.shape[3] <= 4;
  s.channels = x.shape.size() == 3 ? 1 : last ? x.shape[3] : x.shape[1];
  s.height = x.shape[x.shape.size() == 4 && !last ? 2 : 1];
  s.width = x.shape[x.shape.size() == 4 && !last ? 3 : 2];
  RT_CHECK(s.count > 0 && s.channels > 0 && s.height > 0 && s.width > 0, what_x, ": has an empty dimension");
  const std::int64_t plane = s.height * s.width;
  s.pixels.resize(std::size_t(s.count * s.channels * plane));
  if (last) {  // NHWC -> NCHW
    for (std::int64_t n = 0; n < s.count; ++n)
      for (std::int64_t p = 0; p < plane; ++p)
        for (std::int64_t c = 0; c < s.channels; ++c)
          s.pixels[std::size_t((n * s.channels + c) * plane + p)] = x.bytes[std::size_t((n * plane + p) * s.channels + c)];
  } else {
    s.pixels = x.bytes;
  }
  RT_CHECK(y.shape.size() == 1 || (y.shape.size() == 2 && y.shape[1] == 1), what_y, ": shape must be [N] or [N, 1]");
  RT_CHECK(y.shape[0] == s.count, what_y, ": ", y.shape[0], " labels for ", s.count, " images");
  const char kind = y.descr.size() >= 2 ? y.descr[1] : '?';
  RT_CHECK(kind == 'i' || kind == 'u', what_y, ": dtype '", y.descr, "' must be an integer type");
  const std::size_t item = std::size_t(std::stoi(y.descr.substr(2)));
  for (std::int64_t i = 0; i < s.count; ++i) {
    std::uint64_t u = 0;
    for (std::size_t k = 0; k < item; ++k) u |= std::uint64_t(y.bytes[std::size_t(i) * item + k]) << (8 * k);
    std::int64_t v = std::int64_t(u);
    if (kind == 'i' && item < 8 && (u >> (8 * item - 1)) & 1) v -= std::int64_t(1) << (8 * item);  // sign
    RT_CHECK(v >= 0, what_y, ": label ", v, " of sample ", i, " is negative");
    s.labels.push_back(v);
  }
  return s;
}

// Pixels of one image as CHW bytes; `channels` 0 = as stored (gray 1, colour 3).
void decode_png(const std::string& path, ImageSet& s) {
  png_image im;
  std::memset(&im, 0, sizeof im);
  im.version = PNG_IMAGE_VERSION;
  RT_CHECK(png_image_begin_read_from_file(&im, path.c_str()) != 0, path, ": not a readable PNG: ", im.message);
  const bool color = (im.format & PNG_FORMAT_FLAG_COLOR) != 0;
  im.format = color ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  std::vector<std::uint8_t> buf(PNG_IMAGE_SIZE(im));
  RT_CHECK(png_image_finish_read(&im, nullptr, buf.data(), 0, nullptr) != 0, path, ": corrupt PNG: ", im.message);
  s.channels = color ? 3 : 1, s.height = im.height, s.width = im.width;
  s.pixels = std::move(buf);  // interleaved HWC
}

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void decode_jpeg(const std::string& path, ImageSet& s) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  RT_CHECK(f != nullptr, path, ": cannot open");
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = [](j_common_ptr c) {
    auto* e = reinterpret_cast<JpegError*>(c->err);
    c->err->format_message(c, e->message);
    std::longjmp(e->jump, 1);
  };
  std::string failure;
  if (setjmp(err.jump)) {
    failure = err.message;
  } else {
    jpeg_create_decompress(&cinfo);
    jpeg_stdio_src(&cinfo, f.get());
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = cinfo.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    s.channels = cinfo.output_components, s.height = cinfo.output_height, s.width = cinfo.output_width;
    s.pixels.resize(std::size_t(s.channels * s.height * s.width));
    while (cinfo.output_scanline < cinfo.output_height) {
      JSAMPROW row = s.pixels.data() + std::size_t(cinfo.output_scanline) * std::size_t(s.width * s.channels);
      jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
  }
  jpeg_destroy_decompress(&cinfo);
  RT_CHECK(failure.empty(), path, ": corrupt JPEG: ", failure);
}

std::string lower_ext(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return e;
}

}  // namespace

std::pair<ImageSet, ImageSet> read_npz(const std::string& path) {
  int code = 0;
  std::unique_ptr<zip_t, int (*)(zip_t*)> z(zip_open(path.c_str(), ZIP_RDONLY, &code), zip_close);
  if (!z) {
    zip_error_t e;
    zip_error_init_with_code(&e, code);
    std::string m = zip_error_strerror(&e);
    zip_error_fini(&e);
    RT_FAIL(path, ": cannot open as a .npz (zip) archive: ", m);
  }
  std::pair<ImageSet, ImageSet> out;
  for (auto [split, set] : {std::pair{"train", &out.first}, std::pair{"test", &out.second}}) {
    const std::string xs = cat("x_", split), ys = cat("y_", split);
    const Npy x = parse_npy(zip_member(z.get(), path, xs), path + ": " + xs);
    const Npy y = parse_npy(zip_member(z.get(), path, ys), path + ": " + ys);
    *set = images_of(x, y, path + ": " + xs, path + ": " + ys);
    set->sources = {path};
  }
  return out;
}

ImageSet read_image_folders(const std::string& dir, std::vector<std::string>& classes) {
  std::error_code ec;
  RT_CHECK(fs::is_directory(dir, ec), dir, ": no such directory (expected one sub-folder of images per class)");
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory()) found.push_back(e.path().filename().string());
  std::sort(found.begin(), found.end());
  RT_CHECK(!found.empty(), dir, ": no class folders (expected DIR/<class>/*.png|*.jpg)");
  if (classes.empty()) classes = found;
  RT_CHECK(found == classes, dir, ": its class folders differ from the train split's (", found.size(), " vs ",
           classes.size(), " folders; every split needs the same class names)");
  ImageSet s;
  for (std::size_t k = 0; k < classes.size(); ++k) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(fs::path(dir) / classes[k], ec)) {
      const std::string x = lower_ext(e.path());
      if (e.is_regular_file() && (x == ".png" || x == ".jpg" || x == ".jpeg")) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());  // a fixed order: the same files give the same bytes
    RT_CHECK(!files.empty(), (fs::path(dir) / classes[k]).string(), ": no .png/.jpg/.jpeg images");
    for (const auto& f : files) {
      ImageSet one;
      if (lower_ext(f) == ".png") decode_png(f.string(), one);
      else decode_jpeg(f.string(), one);
      if (s.count == 0) s.channels = one.channels, s.height = one.height, s.width = one.width;
      RT_CHECK(one.channels == s.channels && one.height == s.height && one.width == s.width, f.string(), ": image is ",
               one.channels, "x", one.height, "x", one.width, " (CxHxW) but the first image (", s.sources.front(),
               ") is ", s.channels, "x", s.height, "x", s.width, ": resize/convert them to one size");
      const std::int64_t plane = s.height * s.width;
      for (std::int64_t c = 0; c < s.channels; ++c)  // HWC -> CHW
        for (std::int64_t p = 0; p < plane; ++p) s.pixels.push_back(one.pixels[std::size_t(p * s.channels + c)]);
      s.labels.push_back(std::int64_t(k));
      s.sources.push_back(f.string());
      ++s.count;
    }
  }
  return s;
}

}  // namespace ringtrain::data
