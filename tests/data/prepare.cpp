// Conversion round trips against the raw bytes (the Debian Fashion-MNIST files,
// generated IDX and CIFAR-10 fixtures), the schema's attributes, the atomic
// write, and each malformed-input error with its message.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "fixtures.hpp"
#include "support/error_of.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/data/prepare.hpp"
#include "ringtrain/data/sources.hpp"

using namespace ringtrain;
using test_support::error_of;
using namespace ringtrain::data;
using rtfix::TempDir;

namespace {

const std::string kFashion = "/usr/share/datasets/fashion-mnist";

// Concatenation of every shard's /images and /labels, in the given order.
void read_all(const std::vector<std::string>& files, std::vector<std::uint8_t>& px, std::vector<std::int64_t>& lb) {
  px.clear(), lb.clear();
  for (auto& f : files) {
    auto p = rtfix::h5_read_u8(f, "images");
    auto l = rtfix::h5_read_i64(f, "labels");
    px.insert(px.end(), p.begin(), p.end());
    lb.insert(lb.end(), l.begin(), l.end());
  }
}


}  // namespace

TEST(Prepare, FashionMnistRoundTripEveryPixelAndLabel) {
  if (!std::filesystem::exists(kFashion + "/train-images-idx3-ubyte.gz")) GTEST_SKIP() << "no " << kFashion;
  TempDir dir("fmnist");
  PrepareOptions o;
  o.input = kFashion;
  o.output = dir.path.string();
  o.storage.num_shards = 3;
  auto out = prepare_dataset(o, Communicator::world());
  ASSERT_EQ(out.train_files.size(), 3u);
  EXPECT_EQ(out.train.name, "fashion-mnist");
  EXPECT_EQ(out.train.total_count, 60000);
  EXPECT_EQ(out.train.class_names.at(9), "Ankle boot");
  for (auto [split, prefix] : {std::pair{"train", "train"}, std::pair{"test", "t10k"}}) {
    auto& files = std::string(split) == "train" ? out.train_files : out.test_files;
    std::vector<std::uint8_t> px;
    std::vector<std::int64_t> lb;
    read_all(files, px, lb);
    auto im = rtfix::gunzip(kFashion + "/" + prefix + "-images-idx3-ubyte.gz");
    auto lr = rtfix::gunzip(kFashion + "/" + prefix + "-labels-idx1-ubyte.gz");
    ASSERT_EQ(px.size() + 16, im.size()) << split;
    ASSERT_EQ(lb.size() + 8, lr.size()) << split;
    EXPECT_TRUE(std::equal(px.begin(), px.end(), im.begin() + 16)) << split << " pixels differ";
    for (std::size_t i = 0; i < lb.size(); ++i) ASSERT_EQ(lb[i], lr[8 + i]) << split << " label " << i;
  }
  // Fashion-MNIST's well-known train statistics, and the same on the test split.
  auto mean = rtfix::h5_read_attr_f64(out.test_files[0], "mean");
  auto sd = rtfix::h5_read_attr_f64(out.test_files[0], "std");
  EXPECT_NEAR(mean.at(0), 0.2860, 5e-4);
  EXPECT_NEAR(sd.at(0), 0.3530, 5e-4);
  for (auto& e : std::filesystem::directory_iterator(dir.path))
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << "left a temporary: " << e.path();
}

TEST(Prepare, GeneratedIdxRawAndGzipSingleAndShards) {
  for (bool gz : {false, true}) {
    TempDir dir(gz ? "idxgz" : "idxraw");
    std::string sfx = gz ? ".gz" : "";
    rtfix::write_idx_pair(dir / ("train-images-idx3-ubyte" + sfx), dir / ("train-labels-idx1-ubyte" + sfx), 103, 5, 6,
                          gz, 4);
    rtfix::write_idx_pair(dir / ("t10k-images-idx3-ubyte" + sfx), dir / ("t10k-labels-idx1-ubyte" + sfx), 17, 5, 6, gz,
                          4);
    for (int shards : {1, 4}) {
      PrepareOptions o;
      o.input = dir.path.string();
      o.output = dir / ("out" + std::to_string(shards));
      o.name = "tiny";
      o.storage.num_shards = shards;
      o.storage.chunk_samples = 10;
      o.storage.deflate = shards == 4 ? 4 : 0;
      auto out = prepare_dataset(o, Communicator::world());
      ASSERT_EQ(int(out.train_files.size()), shards);
      std::vector<std::uint8_t> px;
      std::vector<std::int64_t> lb;
      read_all(out.train_files, px, lb);
      ASSERT_EQ(px.size(), 103u * 30);
      for (std::uint32_t i = 0; i < 103; ++i) {
        ASSERT_EQ(lb[i], i % 4);
        for (std::uint32_t j = 0; j < 30; ++j) ASSERT_EQ(px[i * 30 + j], (i * 7 + j * 3) % 256);
      }
      EXPECT_EQ(out.train.num_classes, 4);
      EXPECT_EQ(out.train.channels, 1);
      // mean attribute == mean of the bytes, computed here.
      double m = std::accumulate(px.begin(), px.end(), 0.0) / double(px.size()) / 255.0;
      EXPECT_NEAR(out.train.mean.at(0), m, 1e-12);
    }
  }
}

TEST(Prepare, Cifar10Batches) {
  TempDir dir("cifar");
  auto batch = [&](const std::string& name, int n, int base) {
    std::vector<std::uint8_t> b;
    for (int i = 0; i < n; ++i) {
      b.push_back(std::uint8_t((base + i) % 10));
      for (int j = 0; j < 3072; ++j) b.push_back(std::uint8_t((base + i + j) % 251));
    }
    rtfix::write_bytes(dir / name, b, false);
  };
  for (int k = 1; k <= 5; ++k) batch("data_batch_" + std::to_string(k) + ".bin", 3, 100 * k);
  batch("test_batch.bin", 2, 7);
  PrepareOptions o;
  o.input = dir.path.string();
  o.output = dir / "out";
  auto out = prepare_dataset(o, Communicator::world());
  EXPECT_EQ(out.train.name, "cifar10");
  EXPECT_EQ(out.train.total_count, 15);
  EXPECT_EQ(out.train.channels, 3);
  auto px = rtfix::h5_read_u8(out.train_files[0], "images");
  auto lb = rtfix::h5_read_i64(out.train_files[0], "labels");
  for (int k = 0; k < 5; ++k)
    for (int i = 0; i < 3; ++i) {
      int base = 100 * (k + 1), s = 3 * k + i;
      ASSERT_EQ(lb[s], (base + i) % 10);
      for (int j = 0; j < 3072; ++j) ASSERT_EQ(px[s * 3072 + j], (base + i + j) % 251);
    }
}

TEST(Prepare, BadIdxInputsNameTheFileAndProblem) {
  TempDir dir("badidx");
  auto prep = [&](const std::string& in) {
    PrepareOptions o;
    o.input = in;
    o.output = dir / "out";
    return error_of([&] { prepare_dataset(o, Communicator::world()); });
  };
  auto setup = [&](const std::string& sub) {
    std::filesystem::create_directories(dir / sub);
    rtfix::write_idx_pair(dir / (sub + "/train-images-idx3-ubyte"), dir / (sub + "/train-labels-idx1-ubyte"), 20, 4,
                          4, false);
    rtfix::write_idx_pair(dir / (sub + "/t10k-images-idx3-ubyte"), dir / (sub + "/t10k-labels-idx1-ubyte"), 5, 4, 4,
                          false);
    return dir / sub;
  };
  // Bad magic.
  std::string d = setup("magic");
  {
    auto b = rtfix::gunzip(d + "/train-images-idx3-ubyte");
    b[0] = 0x12;
    rtfix::write_bytes(d + "/train-images-idx3-ubyte", b, false);
  }
  std::string m = prep(d);
  EXPECT_NE(m.find("train-images-idx3-ubyte"), std::string::npos) << m;
  EXPECT_NE(m.find("bad IDX magic"), std::string::npos) << m;
  // Truncated payload.
  d = setup("trunc");
  std::filesystem::resize_file(d + "/train-images-idx3-ubyte", 16 + 20 * 16 - 5);
  m = prep(d);
  EXPECT_NE(m.find("train-images-idx3-ubyte: truncated IDX payload"), std::string::npos) << m;
  // Truncated gzip stream.
  d = setup("truncgz");
  {
    auto b = rtfix::gunzip(d + "/t10k-labels-idx1-ubyte");
    rtfix::write_bytes(d + "/t10k-labels-idx1-ubyte.gz", b, true);
    std::filesystem::remove(d + "/t10k-labels-idx1-ubyte");
    auto sz = std::filesystem::file_size(d + "/t10k-labels-idx1-ubyte.gz");
    std::filesystem::resize_file(d + "/t10k-labels-idx1-ubyte.gz", sz - 6);
  }
  m = prep(d);
  EXPECT_NE(m.find("t10k-labels-idx1-ubyte.gz"), std::string::npos) << m;
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  // Count mismatch between images and labels.
  d = setup("count");
  rtfix::write_idx_pair(d + "/train-images-idx3-ubyte", dir / "unused-labels", 21, 4, 4, false);
  m = prep(d);
  EXPECT_NE(m.find("image/label count mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find("21 images"), std::string::npos) << m;
  EXPECT_NE(m.find("train-labels-idx1-ubyte has 20 labels"), std::string::npos) << m;
  // Missing file.
  d = setup("missing");
  std::filesystem::remove(d + "/t10k-images-idx3-ubyte");
  m = prep(d);
  EXPECT_NE(m.find("missing t10k-images-idx3-ubyte"), std::string::npos) << m;
  // Label out of range for the given class names.
  d = setup("range");
  {
    PrepareOptions o;
    o.input = d;
    o.output = dir / "out";
    o.class_names = {"a", "b", "c"};
    m = error_of([&] { prepare_dataset(o, Communicator::world()); });
    EXPECT_NE(m.find("label 3 of sample 3 is out of range (3 classes)"), std::string::npos) << m;
  }
  // A broken input never leaves a file under a final name.
  EXPECT_FALSE(std::filesystem::exists(dir / "out/mnist-train.h5"));
}

TEST(Prepare, SyntheticIsLearnableAndDeterministic) {
  TempDir dir("synth");
  SyntheticOptions o;
  o.output = dir / "a";
  o.train_samples = 64, o.test_samples = 8;
  o.channels = 3, o.height = 16, o.width = 16;
  o.num_classes = 4;
  o.seed = 5;
  o.storage.num_shards = 3;
  auto a = generate_synthetic(o, Communicator::world());
  o.output = dir / "b";
  o.storage.num_shards = 1;
  auto b = generate_synthetic(o, Communicator::world());
  std::vector<std::uint8_t> pa, pb;
  std::vector<std::int64_t> la, lb;
  read_all(a.train_files, pa, la);
  read_all(b.train_files, pb, lb);
  EXPECT_EQ(pa, pb) << "content must not depend on the shard count";
  EXPECT_EQ(la, lb);
  // Learnable: a nearest-class-mean classifier (means from the first half) beats chance by far on the second half.
  const int sb = 3 * 16 * 16;
  std::vector<double> mean(4 * sb, 0.0);
  std::vector<int> n(4, 0);
  for (int i = 0; i < 32; ++i) {
    n[la[i]]++;
    for (int j = 0; j < sb; ++j) mean[la[i] * sb + j] += pa[i * sb + j];
  }
  int correct = 0;
  for (int i = 32; i < 64; ++i) {
    int best = -1;
    double bd = 1e300;
    for (int k = 0; k < 4; ++k) {
      if (!n[k]) continue;
      double d = 0;
      for (int j = 0; j < sb; ++j) d += std::pow(pa[i * sb + j] - mean[k * sb + j] / n[k], 2);
      if (d < bd) bd = d, best = k;
    }
    correct += best == la[i];
  }
  EXPECT_GE(correct, 28) << "synthetic classes should be separable";
  // Stored statistics equal the statistics of the stored bytes.
  for (int c = 0; c < 3; ++c) {
    double s = 0, s2 = 0;
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 256; ++j) {
        double v = pa[i * sb + c * 256 + j] / 255.0;
        s += v, s2 += v * v;
      }
    double m = s / (64 * 256);
    EXPECT_NEAR(a.train.mean[c], m, 1e-9);
    EXPECT_NEAR(a.train.std[c], std::sqrt(s2 / (64 * 256) - m * m), 1e-9);
  }
}
