// The user's own data: a .npz written by NumPy (/usr/bin/python3) and PNG/JPEG
// class folders written by Pillow are prepared into the schema; the stored
// bytes and labels equal the arrays python wrote (PNG exactly; JPEG as Pillow
// decodes it); h5py-written files pass prepare --check; bad inputs give
// errors naming the file and the problem.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <fstream>

#include "ringtrain/data/prepare.hpp"
#include "ringtrain/data/schema.hpp"
#include "support/error_of.hpp"
#include "support/numpy_files.hpp"

using namespace ringtrain;
using test_support::error_of;
using test_support::python;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& tag) { return test_support::temp_dir("rt-own", tag); }

std::vector<std::uint8_t> read_u8(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// /images and /labels of a prepared single-file split.
void read_h5(const std::string& path, std::vector<std::uint8_t>& x, std::vector<std::int64_t>& y) {
  const data::FileInfo info = data::read_file_info(path);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  x.resize(std::size_t(info.count * info.sample_bytes()));
  y.resize(std::size_t(info.count));
  hid_t d = H5Dopen2(f, "images", H5P_DEFAULT);
  H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data());
  H5Dclose(d);
  d = H5Dopen2(f, "labels", H5P_DEFAULT);
  H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, y.data());
  H5Dclose(d);
  H5Fclose(f);
}

data::PreparedDataset prepare(const fs::path& in, const fs::path& out, data::SourceFormat fmt) {
  data::PrepareOptions o;
  o.input = in.string();
  o.output = out.string();
  o.format = fmt;
  return data::prepare_dataset(o, Communicator());
}

}  // namespace

TEST(OwnData, NpzChannelsLastIsStoredAsNchwWithItsLabels) {
  const fs::path d = temp_dir("npz");
  // [N, H, W, C] uint8 (channels last), int32 labels [N, 1]; the expected NCHW bytes written separately.
  python(d, "r = np.random.default_rng(3)\n"
            "xtr = r.integers(0, 256, (7, 5, 6, 3), dtype=np.uint8); xte = r.integers(0, 256, (4, 5, 6, 3), "
            "dtype=np.uint8)\n"
            "ytr = np.array([[0], [4], [2], [1], [3], [4], [0]], np.int32); yte = np.array([[1], [0], [4], [2]], np.int32)\n"
            "np.savez_compressed('d.npz', x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)\n"
            "open('train.x', 'wb').write(xtr.transpose(0, 3, 1, 2).tobytes())\n"
            "open('test.x', 'wb').write(xte.transpose(0, 3, 1, 2).tobytes())\n"
            "open('train.y', 'wb').write(ytr.astype(np.int64).tobytes()); "
            "open('test.y', 'wb').write(yte.astype(np.int64).tobytes())\n");
  auto ds = prepare(d / "d.npz", d / "out", data::SourceFormat::npz);
  EXPECT_EQ(ds.train.channels, 3);
  EXPECT_EQ(ds.train.height, 5);
  EXPECT_EQ(ds.train.width, 6);
  EXPECT_EQ(ds.train.num_classes, 5);
  EXPECT_EQ(ds.train.name, "d");
  for (const char* split : {"train", "test"}) {
    std::vector<std::uint8_t> x;
    std::vector<std::int64_t> y;
    read_h5((d / "out" / (std::string("d-") + split + ".h5")).string(), x, y);
    EXPECT_EQ(x, read_u8(d / (std::string(split) + ".x"))) << split;
    const auto yb = read_u8(d / (std::string(split) + ".y"));
    ASSERT_EQ(yb.size(), y.size() * 8);
    EXPECT_EQ(std::memcmp(yb.data(), y.data(), yb.size()), 0) << split;
  }
  EXPECT_NE(data::check_prepared((d / "out").string()).find("ok: train 7 samples"), std::string::npos);
  fs::remove_all(d);
}

TEST(OwnData, PngAndJpegFoldersAreOneClassEach) {
  const fs::path d = temp_dir("img");
  // PNG is lossless: the bytes must be exactly the arrays; JPEG: what Pillow decodes.
  python(d, "from PIL import Image\n"
            "r = np.random.default_rng(5); exp = {'train': [], 'test': []}\n"
            "for split, n in (('train', 3), ('test', 2)):\n"
            "  for k, cls in enumerate(['bag', 'coat', 'shoe']):\n"
            "    os.makedirs(f'imgs/{split}/{cls}')\n"
            "    for i in range(n):\n"
            "      a = r.integers(0, 256, (8, 9), dtype=np.uint8)\n"
            "      if cls == 'coat':\n"
            "        Image.fromarray(a).save(f'imgs/{split}/{cls}/{i}.jpg', quality=95)\n"
            "        a = np.asarray(Image.open(f'imgs/{split}/{cls}/{i}.jpg'))\n"
            "      else:\n"
            "        Image.fromarray(a).save(f'imgs/{split}/{cls}/{i}.png')\n"
            "      exp[split].append(a)\n"
            "  open(f'{split}.x', 'wb').write(np.stack(exp[split]).tobytes())\n");
  auto ds = prepare(d / "imgs", d / "out", data::SourceFormat::images);
  EXPECT_EQ(ds.train.class_names, (std::vector<std::string>{"bag", "coat", "shoe"}));
  EXPECT_EQ(ds.train.channels, 1);
  for (const char* split : {"train", "test"}) {
    std::vector<std::uint8_t> x;
    std::vector<std::int64_t> y;
    read_h5((d / "out" / (std::string("imgs-") + split + ".h5")).string(), x, y);
    EXPECT_EQ(x, read_u8(d / (std::string(split) + ".x"))) << split;
    const std::int64_t n = split == std::string("train") ? 3 : 2;
    for (std::size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], std::int64_t(i) / n) << split << " " << i;
  }
  fs::remove_all(d);
}

TEST(OwnData, BadInputsNameTheFileAndTheProblem) {
  const fs::path d = temp_dir("bad");
  python(d, "x = np.zeros((4, 5, 5), np.uint8); y = np.zeros(4, np.int64)\n"
            "np.savez('nolabels.npz', x_train=x, y_train=y, x_test=x)\n"
            "np.savez('float.npz', x_train=x.astype(np.float32), y_train=y, x_test=x, y_test=y)\n"
            "np.savez('count.npz', x_train=x, y_train=y[:3], x_test=x, y_test=y)\n"
            "np.savez('neg.npz', x_train=x, y_train=y - 1, x_test=x, y_test=y)\n"
            "open('junk.npz', 'wb').write(b'not a zip')\n"
            "from PIL import Image\n"
            "for s in ('train', 'test'):\n"
            "  os.makedirs(f'imgs/{s}/a'); os.makedirs(f'imgs/{s}/b')\n"
            "  Image.fromarray(np.zeros((4, 4), np.uint8)).save(f'imgs/{s}/a/0.png')\n"
            "  Image.fromarray(np.zeros((5, 4), np.uint8)).save(f'imgs/{s}/b/0.png')\n"
            "os.makedirs('imgs2/train/a'); os.makedirs('imgs2/test/b')\n"
            "open('imgs2/train/a/0.png', 'wb').write(b'broken')\n");
  auto err = [&](const char* in, data::SourceFormat f) { return error_of([&] { prepare(d / in, d / "o", f); }); };
  using F = data::SourceFormat;
  EXPECT_NE(err("nolabels.npz", F::npz).find("nolabels.npz: no array 'y_test'"), std::string::npos);
  EXPECT_NE(err("float.npz", F::npz).find("float.npz: x_train: dtype '<f4' must be uint8"), std::string::npos);
  EXPECT_NE(err("count.npz", F::npz).find("count.npz: y_train: 3 labels for 4 images"), std::string::npos);
  EXPECT_NE(err("neg.npz", F::npz).find("neg.npz: y_train: label -1 of sample 0 is negative"), std::string::npos);
  EXPECT_NE(err("junk.npz", F::npz).find("junk.npz: cannot open as a .npz (zip) archive"), std::string::npos);
  const std::string e = err("imgs", F::images);
  EXPECT_NE(e.find("b/0.png: image is 1x5x4 (CxHxW) but the first image"), std::string::npos) << e;
  EXPECT_NE(err("imgs2", F::images).find("0.png: not a readable PNG"), std::string::npos) << err("imgs2", F::images);
  // --check: a directory without data, and a label that h5py wrote out of range.
  fs::create_directories(d / "half");
  EXPECT_NE(error_of([&] { data::check_prepared((d / "half").string()); }).find("half"), std::string::npos);
  python(d, "np.savez('ok.npz', x_train=np.zeros((4, 5, 5), np.uint8), y_train=np.arange(4), "
            "x_test=np.zeros((2, 5, 5), np.uint8), y_test=np.arange(2))\n");
  prepare(d / "ok.npz", d / "ok", F::npz);
  EXPECT_EQ(data::check_prepared((d / "ok").string()).find("error"), std::string::npos);
  python(d, "import h5py\nf = h5py.File('ok/ok-test.h5', 'r+'); f['labels'][1] = 7; f.close()\n");
  EXPECT_NE(error_of([&] { data::check_prepared((d / "ok").string()); })
                .find("ok-test.h5: label 7 of sample 1 is out of range [0, 4)"),
            std::string::npos);
  fs::remove_all(d);
}

// examples/own_data: make_npz.py writes Fashion-MNIST's IDX arrays as a .npz;
// prepared, its bytes and labels equal the IDX route's; write_h5.py's h5py
// files pass prepare --check and hold the same bytes too.
TEST(OwnData, ExampleScriptsGiveTheIdxBytes) {
  const char* src = std::getenv("RINGTRAIN_SOURCE_DIR");
  if (!src) GTEST_SKIP() << "RINGTRAIN_SOURCE_DIR not set (ctest sets it)";
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const fs::path d = temp_dir("example");
  const fs::path ex = fs::path(src) / "examples" / "own_data";
  const std::string cmd = "/usr/bin/python3 " + (ex / "make_npz.py").string() + " " + (d / "fm.npz").string() +
                          " 600 200 > /dev/null && /usr/bin/python3 " + (ex / "write_h5.py").string() + " " +
                          (d / "fm.npz").string() + " " + (d / "h5py").string() + " fm > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  prepare(d / "fm.npz", d / "npz", data::SourceFormat::npz);
  prepare("/usr/share/datasets/fashion-mnist", d / "idx", data::SourceFormat::idx);
  EXPECT_NE(data::check_prepared((d / "h5py").string()).find("ok: train 600 samples"), std::string::npos);
  for (const char* split : {"train", "test"}) {
    std::vector<std::uint8_t> xi, xn, xh;
    std::vector<std::int64_t> yi, yn, yh;
    read_h5((d / "idx" / (std::string("fashion-mnist-") + split + ".h5")).string(), xi, yi);
    read_h5((d / "npz" / (std::string("fm-") + split + ".h5")).string(), xn, yn);
    read_h5((d / "h5py" / (std::string("fm-") + split + ".h5")).string(), xh, yh);
    const std::size_t n = split == std::string("train") ? 600 : 200;
    ASSERT_EQ(yn.size(), n);
    EXPECT_TRUE(std::equal(xn.begin(), xn.end(), xi.begin())) << split;  // the first n IDX images
    EXPECT_TRUE(std::equal(yn.begin(), yn.end(), yi.begin())) << split;
    EXPECT_EQ(xh, xn) << split;
    EXPECT_EQ(yh, yn) << split;
  }
  fs::remove_all(d);
}
