// The schema both ways with h5py (/usr/bin/python3): our files pass the
// independent h5py validator (data/inspect_h5.py), and a file written by h5py
// the way a user would (uint8 labels, fixed-length byte-string class names)
// loads with the right pixels and labels. Skipped without python3 + h5py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "fixtures.hpp"
#include "ringtrain/data/loader.hpp"
#include "ringtrain/data/prepare.hpp"

using namespace ringtrain;
using namespace ringtrain::data;

namespace {
bool have_h5py() { return std::system("/usr/bin/python3 -c 'import h5py, numpy' >/dev/null 2>&1") == 0; }
std::string source_dir() {
  const char* s = std::getenv("RINGTRAIN_SOURCE_DIR");
  return s ? s : std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
}
}  // namespace

TEST(H5pyInterop, OurFilesPassTheH5pyValidator) {
  if (!have_h5py()) GTEST_SKIP() << "/usr/bin/python3 without h5py";
  rtfix::TempDir dir("h5py_ours");
  SyntheticOptions o;
  o.output = dir.path.string();
  o.train_samples = 40, o.test_samples = 10;
  o.channels = 3, o.height = 8, o.width = 8;
  o.storage.num_shards = 3;
  o.storage.deflate = 2;
  generate_synthetic(o, Communicator::world());
  std::string cmd = "/usr/bin/python3 " + source_dir() + "/data/inspect_h5.py " + dir.path.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  // And it does fail on a violation: a label out of range.
  std::string spoil = "/usr/bin/python3 -c \"import h5py; f = h5py.File('" + dir / "synthetic-test-00001-of-00003.h5" +
                      "', 'r+'); f['labels'][0] = 99\"";
  ASSERT_EQ(std::system(spoil.c_str()), 0);
  EXPECT_NE(std::system((cmd + " >/dev/null").c_str()), 0);
}

TEST(H5pyInterop, LoaderReadsAFileWrittenByH5py) {
  if (!have_h5py()) GTEST_SKIP() << "/usr/bin/python3 without h5py";
  rtfix::TempDir dir("h5py_theirs");
  std::string py = dir / "w.py", path = dir / "mine-train.h5";
  std::ofstream(py) << "import h5py, numpy as np\n"
                       "x = (np.arange(20 * 2 * 3 * 3) % 251).astype(np.uint8).reshape(20, 2, 3, 3)\n"
                       "with h5py.File('" << path << "', 'w') as f:\n"
                       "    f['images'] = x\n"
                       "    f['labels'] = (np.arange(20) % 4).astype(np.uint8)\n"
                       "    f.attrs.update(schema_version=1, name='mine', split='train', num_classes=4,\n"
                       "                   class_names=np.array([b'a', b'b', b'c', b'd']), mean=[0.5, 0.5],\n"
                       "                   std=[0.25, 0.25], shard_index=0, num_shards=1, first_index=0,\n"
                       "                   total_count=20)\n";
  ASSERT_EQ(std::system(("/usr/bin/python3 " + py).c_str()), 0);
  LoaderOptions lo;
  lo.files = find_split_files(dir.path.string(), "train");
  lo.batch_size = 20;
  lo.shuffle = false;
  Loader l(lo, Communicator::world());
  EXPECT_EQ(l.info().class_names.at(3), "d");
  auto b = l.next();
  ASSERT_TRUE(b);
  for (int i = 0; i < 20 * 18; ++i)
    ASSERT_FLOAT_EQ(b->images.data<float>()[i], float(((i % 251) / 255.0 - 0.5) / 0.25)) << i;
  for (int i = 0; i < 20; ++i) ASSERT_EQ(b->labels.data<std::int64_t>()[i], i % 4);
}
