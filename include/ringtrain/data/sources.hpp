#pragma once
// Readers for the raw formats `ringtrain prepare` converts: MNIST-style IDX
// files (gzip or raw: zlib's gzread reads both) and CIFAR-10 binary batches.
// Rules: every malformed input (bad magic, unsupported element type,
// truncated payload, image/label count mismatch) is an Error naming the file
// and the problem; nothing is trusted before it is checked.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ringtrain::data {

// An IDX array of unsigned bytes (element type 0x08), dims as in the header.
struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;
};
IdxArray read_idx(const std::string& path);

// Whole file contents through zlib (gzip or plain). Throws Error naming the file.
std::vector<std::uint8_t> read_gz_or_raw(const std::string& path);

// One NumPy array (.npy bytes): little-endian dtype string ('<u2', '|u1'),
// C-order shape, payload. Errors name `what` ("FILE.npz: x_train").
struct Npy {
  std::string descr;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;  // the payload, little-endian as stored
};
Npy parse_npy(const std::vector<std::uint8_t>& bytes, const std::string& what);

// Images in NCHW uint8 with their labels.
struct ImageSet {
  std::int64_t count = 0, channels = 0, height = 0, width = 0;
  std::vector<std::uint8_t> pixels;  // count * C * H * W
  std::vector<std::int64_t> labels;  // count
  std::vector<std::string> sources;  // file names it came from
};

// IDX images [N,H,W] (or [N,C,H,W]) + IDX labels [N]; C = 1 for rank-3 images.
ImageSet read_idx_pair(const std::string& images, const std::string& labels);
// CIFAR-10 binary batches (records of 1 label byte + 3*32*32 pixels, CHW), concatenated.
ImageSet read_cifar10(const std::vector<std::string>& batches);
// A NumPy .npz with uint8 x_train/x_test ([N,H,W], [N,H,W,C] with C <= 4, or
// [N,C,H,W]) and integer y_train/y_test ([N] or [N,1]): (train, test).
std::pair<ImageSet, ImageSet> read_npz(const std::string& path);
// DIR/<class>/*.png|*.jpg|*.jpeg, classes in name order (label k = k-th
// folder), files in name order. `classes` empty: set from DIR; else DIR must
// have exactly these folders. All images must have one size and channel count.
ImageSet read_image_folders(const std::string& dir, std::vector<std::string>& classes);

}  // namespace ringtrain::data
