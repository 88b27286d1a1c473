// MappedCheckpoint (checkpoint/read.hpp), export's reader: a tensor read whole
// from the mapped file is the one written, checked as it is read. From 4 MiB on
// its check runs in two halves on two threads, their CRCs joined by zlib's
// crc32_combine: a clean 8 MiB tensor passes (and a 4 KiB one, in one piece),
// a flipped byte in either half fails the checksum naming the tensor, and a
// NaN written by the run itself (a valid CRC) is reported at its element, in
// either half.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/checkpoint/read.hpp"
#include "support/error_of.hpp"

using namespace ringtrain;
namespace fs = std::filesystem;

namespace {

struct Mapped : ::testing::Test {
  fs::path dir = fs::temp_directory_path() / ("rt-mapped-" + std::to_string(::getpid()));
  void SetUp() override { fs::create_directories(dir); }
  void TearDown() override { fs::remove_all(dir); }

  // A one-file checkpoint of param/big ([1024, 2048] float32: 8 MiB) and param/small ([1024]).
  std::string write(const std::string& name, std::int64_t nan_at = -1) {
    Tensor big = Tensor::empty({1024, 2048}), small = Tensor::empty({1024});
    for (std::int64_t i = 0; i < big.numel(); ++i) big.data<float>()[i] = static_cast<float>(i % 977) * 0.5f;
    for (std::int64_t i = 0; i < small.numel(); ++i) small.data<float>()[i] = static_cast<float>(i);
    if (nan_at >= 0) big.data<float>()[nan_at] = std::numeric_limits<float>::quiet_NaN();
    CheckpointData d;
    d.tensors = {{"param/big", big}, {"param/small", small}};
    const std::string path = (dir / name).string();
    write_checkpoint(path, d);
    return path;
  }
  std::string whole_error(const std::string& path, const std::string& tensor) {
    return test_support::error_of([&] {
      const CheckpointIndex ix = read_checkpoint_index(path);
      MappedCheckpoint m(ix);
      std::vector<char> scratch;
      m.whole(ix.tensor_at.at(tensor), scratch);
    });
  }
};

}  // namespace

TEST_F(Mapped, WholeTensorsAreTheWrittenOnesAndTheirHalvesCheckTogether) {
  const std::string path = write("clean.h5");
  const CheckpointIndex ix = read_checkpoint_index(path);
  MappedCheckpoint m(ix);
  std::vector<char> scratch;
  const float* big = static_cast<const float*>(m.whole(ix.tensor_at.at("param/big"), scratch));
  for (std::int64_t i = 0; i < 1024 * 2048; ++i) ASSERT_EQ(big[i], static_cast<float>(i % 977) * 0.5f) << i;
  const float* small = static_cast<const float*>(m.whole(ix.tensor_at.at("param/small"), scratch));
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(small[i], static_cast<float>(i));
  EXPECT_EQ(m.stats().verified_bytes, std::size_t{(1024 * 2048 + 1024) * 4});
}

TEST_F(Mapped, AFlippedByteInEitherHalfFailsTheChecksum) {
  for (std::int64_t at : {std::int64_t{100}, std::int64_t{1024 * 2048 - 5}}) {  // first half, second half
    const std::string path = write("flip.h5");
    const CheckpointIndex ix = read_checkpoint_index(path);
    const std::int64_t off = ix.pieces[ix.tensor_at.at("param/big")].offset;
    ASSERT_GE(off, 0);
    {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(off + at * 4);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 1);
      f.seekp(off + at * 4);
      f.write(&c, 1);
    }
    const std::string e = whole_error(path, "param/big");
    EXPECT_NE(e.find("tensor 'param/big' fails its checksum"), std::string::npos) << at << ": " << e;
    EXPECT_EQ(whole_error(path, "param/small"), "<no error>") << "the other tensor is intact";
  }
}

TEST_F(Mapped, ANaNInEitherHalfIsReportedAtItsElement) {
  for (std::int64_t at : {std::int64_t{7}, std::int64_t{1024 * 1024 + 3}, std::int64_t{1024 * 2048 - 1}}) {
    const std::string e = whole_error(write("nan.h5", at), "param/big");
    EXPECT_NE(e.find("tensor 'param/big' holds NaN or Inf (element " + std::to_string(at) + ")"), std::string::npos)
        << e;
  }
}
