// One-process loader tests: sample content through the whole path (ids
// embedded in the pixels), normalisation, augmentation against a brute-force
// check, determinism, the sampler's rank arithmetic for 1-4 ranks, prefetch
// with slow/fast consumers, stop/seek mid-epoch, and every bad-file error.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "fixtures.hpp"
#include "support/error_of.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/data/loader.hpp"
#include "ringtrain/data/prepare.hpp"

using namespace ringtrain;
using test_support::error_of;
using namespace ringtrain::data;
using rtfix::TempDir;

namespace {

// Index fixture: pixels 0..7 of sample i hold i (little-endian).
PreparedDataset index_fixture(const std::string& out, std::int64_t n, int shards, std::int64_t C = 1,
                              std::int64_t H = 6, std::int64_t W = 5) {
  SyntheticOptions o;
  o.output = out;
  o.name = "ids";
  o.train_samples = n;
  o.channels = C, o.height = H, o.width = W;
  o.num_classes = 7;
  o.seed = 3;
  o.embed_index = true;
  o.storage.num_shards = shards;
  o.storage.chunk_samples = 8;
  return generate_synthetic(o, Communicator::world());
}

std::int64_t decoded_id(const float* img) {
  std::uint64_t v = 0;
  for (int q = 0; q < 8; ++q) v |= std::uint64_t(std::lround(img[q])) << (8 * q);
  return std::int64_t(v);
}


std::vector<std::int64_t> epoch_ids(Loader& l, std::int64_t epoch) {
  l.set_epoch(epoch);
  std::vector<std::int64_t> ids;
  while (auto b = l.next()) ids.insert(ids.end(), b->ids->begin(), b->ids->end());
  return ids;
}

}  // namespace

TEST(Loader, BatchesCarryTheRightPixelsAndLabels) {
  TempDir dir("content");
  for (auto cache : {CachePolicy::always, CachePolicy::never}) {
    for (int shards : {1, 3}) {
      auto ds = index_fixture(dir / ("s" + std::to_string(shards)), 50, shards);
      std::vector<std::int64_t> labels;
      for (auto& f : ds.train_files) {
        auto l = rtfix::h5_read_i64(f, "labels");
        labels.insert(labels.end(), l.begin(), l.end());
      }
      LoaderOptions o;
      o.files = ds.train_files;
      o.batch_size = 8;
      o.normalize = false;
      o.cache = cache;
      Loader l(o, Communicator::world());
      EXPECT_EQ(l.cached(), cache == CachePolicy::always);
      EXPECT_EQ(l.steps_per_epoch(), 7);  // pad: ceil(50 / 8)
      std::vector<int> seen(50, 0);
      std::int64_t steps = 0, valid = 0;
      while (auto b = l.next()) {
        ASSERT_EQ(b->images.shape(), (Shape{8, 1, 6, 5}));
        ASSERT_EQ(b->labels.dtype(), DType::i64);
        const float* px = b->images.data<float>();
        for (int i = 0; i < 8; ++i) {
          std::int64_t id = (*b->ids)[i];
          ASSERT_EQ(decoded_id(px + i * 30), id) << "pixels of another sample";
          ASSERT_EQ(b->labels.data<std::int64_t>()[i], labels[id]);
          if (i < b->valid) seen[id]++;
        }
        valid += b->valid, ++steps;
      }
      EXPECT_EQ(steps, 7);
      EXPECT_EQ(valid, 50);
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    }
  }
}

TEST(Loader, NormalisesWithTheFileStatistics) {
  TempDir dir("norm");
  auto ds = index_fixture(dir.path.string(), 16, 1, 3, 4, 4);
  auto raw = rtfix::h5_read_u8(ds.train_files[0], "images");
  LoaderOptions o;
  o.files = ds.train_files;
  o.batch_size = 4;
  o.shuffle = false;
  Loader l(o, Communicator::world());
  auto b = l.next();
  ASSERT_TRUE(b);
  const float* px = b->images.data<float>();
  for (int i = 0; i < 4 * 48; ++i) {
    int c = (i / 16) % 3;
    double want = (raw[i] / 255.0 - ds.train.mean[c]) / ds.train.std[c];
    ASSERT_NEAR(px[i], want, 1e-5) << i;
  }
}

TEST(Loader, AugmentationIsACropOrFlipOfTheImageAndDeterministic) {
  TempDir dir("aug");
  auto ds = index_fixture(dir.path.string(), 24, 1, 2, 8, 8);
  auto raw = rtfix::h5_read_u8(ds.train_files[0], "images");
  LoaderOptions o;
  o.files = ds.train_files;
  o.batch_size = 6;
  o.normalize = false;
  o.augment = {2, true};
  Loader a(o, Communicator::world()), b(o, Communicator::world());
  int flipped = 0, shifted = 0;
  for (int step = 0; step < 4; ++step) {
    auto x = a.next(), y = b.next();
    ASSERT_TRUE(x && y);
    ASSERT_EQ(std::memcmp(x->images.raw(), y->images.raw(), x->images.nbytes()), 0) << "not deterministic";
    for (int i = 0; i < 6; ++i) {
      const float* out = x->images.data<float>() + i * 128;
      const std::uint8_t* src = raw.data() + (*x->ids)[i] * 128;
      bool found = false;  // brute force over every crop offset and flip
      for (int dy = -2; dy <= 2 && !found; ++dy)
        for (int dx = -2; dx <= 2 && !found; ++dx)
          for (int f = 0; f < 2 && !found; ++f) {
            bool ok = true;
            for (int c = 0; c < 2 && ok; ++c)
              for (int yy = 0; yy < 8 && ok; ++yy)
                for (int xx = 0; xx < 8 && ok; ++xx) {
                  int sy = yy + dy, sx = (f ? 7 - xx : xx) + dx;
                  float want = (sy < 0 || sy > 7 || sx < 0 || sx > 7) ? 0.f : src[c * 64 + sy * 8 + sx];
                  ok = out[c * 64 + yy * 8 + xx] == want;
                }
            if (ok) found = true, flipped += f, shifted += (dx || dy);
          }
      ASSERT_TRUE(found) << "sample " << (*x->ids)[i] << " is no crop/flip of its image";
    }
  }
  EXPECT_GT(flipped, 0);
  EXPECT_GT(shifted, 0);
}

TEST(Loader, SeedAndEpochDetermineTheOrder) {
  TempDir dir("det");
  auto ds = index_fixture(dir.path.string(), 64, 2);
  auto make = [&](std::uint64_t seed) {
    LoaderOptions o;
    o.files = ds.train_files;
    o.batch_size = 8;
    o.seed = seed;
    return std::make_unique<Loader>(o, Communicator::world());
  };
  auto a = make(11), b = make(11), c = make(12);
  auto a0 = epoch_ids(*a, 0), a1 = epoch_ids(*a, 1);
  EXPECT_EQ(a0, epoch_ids(*b, 0));
  EXPECT_NE(a0, a1) << "epochs must differ";
  EXPECT_NE(a0, epoch_ids(*c, 0)) << "seeds must differ";
  EXPECT_EQ(a1, epoch_ids(*b, 1));
  auto s = a0;
  std::sort(s.begin(), s.end());
  for (int i = 0; i < 64; ++i) ASSERT_EQ(s[i], i);
  // Pinned reference: the first ids of seed 11, epoch 0 (mt19937_64 + our Fisher–Yates, fixed on every build).
  std::vector<std::int64_t> first(a0.begin(), a0.begin() + 6);
  std::printf("first ids: %s\n", ::testing::PrintToString(first).c_str());
  EXPECT_EQ(first, (std::vector<std::int64_t>{59, 42, 32, 37, 34, 12}));
}

TEST(Sampler, RankBlocksConcatenateToTheOneRankBatchAndCoverTheEpoch) {
  for (auto tail : {TailPolicy::pad, TailPolicy::drop_last}) {
    for (std::int64_t n : {37, 64, 101}) {
      for (int p = 1; p <= 4; ++p) {
        const std::int64_t b = 4;
        Sampler one({p * b, 1, 0, 9, true, ShuffleMode::global, tail}, {n / 2, n - n / 2});
        std::vector<std::unique_ptr<Sampler>> r;
        for (int k = 0; k < p; ++k)
          r.push_back(std::make_unique<Sampler>(SamplerConfig{b, p, k, 9, true, ShuffleMode::global, tail},
                                                std::vector<std::int64_t>{n}));
        ASSERT_EQ(one.steps_per_epoch(), r[0]->steps_per_epoch());
        std::vector<int> seen(n, 0);
        std::vector<std::int64_t> ref, ids;
        for (std::int64_t s = 0; s < one.steps_per_epoch(); ++s) {
          std::int64_t rv = one.batch(2, s, ref);
          std::vector<std::int64_t> cat;
          std::int64_t valid = 0;
          for (int k = 0; k < p; ++k) {
            valid += r[k]->batch(2, s, ids);
            for (std::int64_t i = 0; i < b; ++i) {
              if (i < std::min<std::int64_t>(b, std::max<std::int64_t>(0, n - (s * p * b + k * b)))) seen[ids[i]]++;
            }
            cat.insert(cat.end(), ids.begin(), ids.end());
          }
          ASSERT_EQ(cat, ref) << "p=" << p << " step " << s;
          ASSERT_EQ(valid, rv);
        }
        for (std::int64_t i = 0; i < n; ++i) {
          if (tail == TailPolicy::pad) {
            ASSERT_EQ(seen[i], 1) << "sample " << i << " p=" << p;
          } else {
            ASSERT_LE(seen[i], 1);
          }
        }
        if (tail == TailPolicy::drop_last) {
          EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n / (p * b) * (p * b));
        }
      }
    }
  }
}

TEST(Loader, PrefetchKeepsUpWithASlowConsumerAndAFastOneGetsEverything) {
  TempDir dir("prefetch");
  auto ds = index_fixture(dir.path.string(), 256, 1, 3, 32, 32);
  LoaderOptions o;
  o.files = ds.train_files;
  o.batch_size = 16;
  o.cache = CachePolicy::never;
  o.prefetch_depth = 3;
  Loader slow(o, Communicator::world());
  std::int64_t n = 0;
  double first_wait = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (auto b = slow.next()) {
    if (n == 0) first_wait = slow.epoch_wait_seconds();
    std::this_thread::sleep_for(std::chrono::milliseconds(8));  // a "training step"
    ++n;
  }
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(n, 16);
  // After the first batch the thread stays ahead: 15 steps of 8 ms, the consumer barely waits.
  double steady = slow.epoch_wait_seconds() - first_wait;
  EXPECT_LT(steady, 0.2 * total) << "waited " << steady << " s of " << total << " s after the first batch";
  Loader fast(o, Communicator::world());
  std::set<std::int64_t> ids;
  for (int e = 0; e < 3; ++e) {
    fast.set_epoch(e);
    while (auto b = fast.next())
      for (std::int64_t i = 0; i < b->valid; ++i) ids.insert((*b->ids)[i] + 1000 * e);
  }
  EXPECT_EQ(ids.size(), 3u * 256);
  EXPECT_GE(fast.wait_seconds(), fast.epoch_wait_seconds());
}

// The nice value of every thread of this process, from /proc/self/task/*/stat.
std::vector<int> thread_nices() {
  std::vector<int> out;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream f(t.path() / "stat");
    std::string line((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;  // the thread ended meanwhile
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    for (int i = 3; i <= 19 && rest >> field; ++i)  // field 19 of proc(5)'s stat: nice
      if (i == 19) out.push_back(std::stoi(field));
  }
  return out;
}

TEST(Loader, ThePrefetchThreadRunsAtTheLowestPriority) {
  TempDir dir("nice");
  auto ds = index_fixture(dir.path.string(), 64, 1);
  LoaderOptions o;
  o.files = ds.train_files;
  o.batch_size = 8;
  const auto before = thread_nices();
  const auto lowest = [](const std::vector<int>& v) { return std::count(v.begin(), v.end(), 19); };
  Loader l(o, Communicator::world());
  ASSERT_TRUE(l.next().has_value());  // the thread has started and delivered
  const auto during = thread_nices();
  EXPECT_EQ(lowest(during), lowest(before) + 1) << "one thread more at nice 19: the loader's";
  EXPECT_EQ(getpriority(PRIO_PROCESS, 0), 0) << "the calling thread keeps its priority";
  std::int64_t n = 1;
  while (l.next()) ++n;
  EXPECT_EQ(n, 8) << "every batch of the epoch still arrives";
}

TEST(Loader, StopsCleanlyMidEpochAndResumesAtTheSameStep) {
  TempDir dir("resume");
  auto ds = index_fixture(dir.path.string(), 96, 3);
  LoaderOptions o;
  o.files = ds.train_files;
  o.batch_size = 8;
  o.seed = 4;
  o.cache = CachePolicy::never;
  std::vector<std::int64_t> full;
  {
    Loader l(o, Communicator::world());
    full = epoch_ids(l, 5);
  }
  {
    Loader l(o, Communicator::world());
    l.set_epoch(5);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(l.next());
    // Destroyed mid-epoch with batches queued: must join without hanging.
  }
  Loader l(o, Communicator::world());
  l.set_epoch(5);
  ASSERT_TRUE(l.next());
  l.stop();
  LoaderState st = l.state();
  EXPECT_EQ(st.epoch, 5);
  EXPECT_EQ(st.step, 1);
  l.skip(3);  // resume as from a checkpoint taken after step 3
  std::vector<std::int64_t> rest;
  while (auto b = l.next()) rest.insert(rest.end(), b->ids->begin(), b->ids->end());
  EXPECT_TRUE(std::equal(rest.begin(), rest.end(), full.begin() + 4 * 8));
  EXPECT_EQ(rest.size(), full.size() - 32);
  EXPECT_EQ(l.state().epoch, 6);  // next() after the end of epoch 5 starts epoch 6
  l.seek({2, 11});
  auto b = l.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->epoch, 2);
  EXPECT_EQ(b->step, 11);
  EXPECT_FALSE(l.next());
  EXPECT_NE(error_of([&] { l.seek({0, 99}); }).find("cannot seek to epoch 0 step 99"), std::string::npos);
}

// ---- bad files: the message names the file and the problem ----------------

namespace {

// A schema-shaped file written with the raw C API, then spoiled by `spoil`.
std::string raw_file(const std::string& path, hsize_t n, int rank, hid_t img_type, hsize_t ln, std::int64_t label,
                     bool with_labels = true, bool with_attrs = true) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t d[4] = {n, 1, 4, 4};
  hid_t s = H5Screate_simple(rank, d, nullptr);
  hid_t ds = H5Dcreate2(f, "images", img_type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  std::vector<double> zeros(n * 16, 1.0);
  H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data());
  H5Dclose(ds), H5Sclose(s);
  if (with_labels) {
    hid_t ls = H5Screate_simple(1, &ln, nullptr);
    hid_t l = H5Dcreate2(f, "labels", H5T_STD_I64LE, ls, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    std::vector<std::int64_t> lab(ln, 0);
    lab.back() = label;
    H5Dwrite(l, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, lab.data());
    H5Dclose(l), H5Sclose(ls);
  }
  if (with_attrs) {
    auto i64 = [&](const char* name, std::int64_t v) {
      hid_t as = H5Screate(H5S_SCALAR);
      hid_t a = H5Acreate2(f, name, H5T_NATIVE_INT64, as, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, H5T_NATIVE_INT64, &v);
      H5Aclose(a), H5Sclose(as);
    };
    auto str = [&](const char* name, const char* v) {
      hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, H5T_VARIABLE);
      hid_t as = H5Screate(H5S_SCALAR);
      hid_t a = H5Acreate2(f, name, t, as, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, t, &v);
      H5Aclose(a), H5Sclose(as), H5Tclose(t);
    };
    auto f64 = [&](const char* name, double v) {
      hsize_t one = 1;
      hid_t as = H5Screate_simple(1, &one, nullptr);
      hid_t a = H5Acreate2(f, name, H5T_NATIVE_DOUBLE, as, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, H5T_NATIVE_DOUBLE, &v);
      H5Aclose(a), H5Sclose(as);
    };
    i64("schema_version", 1), i64("num_classes", 3), i64("shard_index", 0), i64("num_shards", 1);
    i64("first_index", 0), i64("total_count", std::int64_t(n));
    str("name", "bad"), str("split", "train");
    hid_t es = H5Screate(H5S_NULL);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    hid_t a = H5Acreate2(f, "class_names", t, es, H5P_DEFAULT, H5P_DEFAULT);
    H5Aclose(a), H5Tclose(t), H5Sclose(es);
    f64("mean", 0.5), f64("std", 0.25);
  }
  H5Fclose(f);
  return path;
}

std::string open_error(const std::string& path, std::int64_t batch = 2) {
  LoaderOptions o;
  o.files = {path};
  o.batch_size = batch;
  return error_of([&] { Loader l(o, Communicator::world()); });
}

}  // namespace

TEST(LoaderBadInput, EachCaseNamesTheFileAndTheProblem) {
  TempDir dir("bad");
  struct Case {
    std::string file, expect;
    std::int64_t batch = 2;
  };
  std::vector<Case> cases = {
      {dir / "nope.h5", "nope.h5: file not found"},
      {raw_file(dir / "good.h5", 10, 4, H5T_STD_U8LE, 10, 0), "<no error>"},
      {raw_file(dir / "nolabels.h5", 10, 4, H5T_STD_U8LE, 10, 0, false), "nolabels.h5: dataset /labels is missing"},
      {raw_file(dir / "rank3.h5", 10, 3, H5T_STD_U8LE, 10, 0), "rank3.h5: /images must have rank 4 [N,C,H,W], has rank 3"},
      {raw_file(dir / "count.h5", 10, 4, H5T_STD_U8LE, 9, 0),
       "count.h5: image/label count mismatch: /images has 10 samples, /labels has 9"},
      {raw_file(dir / "range.h5", 10, 4, H5T_STD_U8LE, 10, 3),
       "range.h5: label out of range: sample 9 has label 3 but the data set has 3 classes"},
      {raw_file(dir / "dtype.h5", 10, 4, H5T_IEEE_F32LE, 10, 0), "dtype.h5: /images has the wrong dtype (must be uint8)"},
      {raw_file(dir / "noattr.h5", 10, 4, H5T_STD_U8LE, 10, 0, true, false),
       "noattr.h5: attribute 'schema_version' is missing"},
      {dir / "good.h5", "good.h5: batch larger than the data set: 1 ranks x batch 11 = 11 > 10 samples", 11},
  };
  rtfix::write_bytes(dir / "text.h5", std::vector<std::uint8_t>(100, 'x'), false);
  cases.push_back({dir / "text.h5", "text.h5: cannot open as HDF5"});
  rtfix::truncate_copy(dir / "good.h5", dir / "trunc.h5", std::filesystem::file_size(dir / "good.h5") / 2);
  cases.push_back({dir / "trunc.h5", "trunc.h5: cannot open as HDF5: not an HDF5 file, or truncated or corrupt"});
  for (auto& c : cases) {
    std::string m = open_error(c.file, c.batch);
    EXPECT_NE(m.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << m;
  }
  // Shards given out of order, or one missing.
  auto ds = index_fixture(dir / "sh", 30, 3);
  LoaderOptions o;
  o.files = {ds.train_files[1], ds.train_files[0], ds.train_files[2]};
  std::string m = error_of([&] { Loader l(o, Communicator::world()); });
  EXPECT_NE(m.find("is shard 1 of 3 but was given as file 0"), std::string::npos) << m;
  o.files = {ds.train_files[0], ds.train_files[1]};
  m = error_of([&] { Loader l(o, Communicator::world()); });
  EXPECT_NE(m.find("is shard 0 of 3 but was given as file 0 of 2"), std::string::npos) << m;
  // Shard-local batch larger than the rank's shards.
  o.files = ds.train_files;
  o.shuffle_mode = ShuffleMode::shard_local;
  o.batch_size = 31;
  m = error_of([&] { Loader l(o, Communicator::world()); });
  EXPECT_NE(m.find("batch larger than the shard: batch 31 > 30 samples in the shards of rank 0"), std::string::npos) << m;
  EXPECT_NE(m.find("ids-train-00000-of-00003.h5"), std::string::npos) << m;
  // Corrupt compressed chunks (the file opens; the data does not decode): the cached read at open reports it.
  {
    SyntheticOptions so;
    so.output = dir / "corrupt";
    so.train_samples = 64;
    so.channels = 1, so.height = 16, so.width = 16;
    so.storage.deflate = 6;
    so.storage.chunk_samples = 4;
    auto cds = generate_synthetic(so, Communicator::world());
    const std::string f = cds.train_files[0];
    auto size = std::filesystem::file_size(f);
    {
      std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(std::streamoff(size / 2));
      std::vector<char> junk(2048, char(0x5a));
      io.write(junk.data(), std::streamsize(junk.size()));
    }
    LoaderOptions co;
    co.files = {f};
    co.batch_size = 4;
    co.cache = CachePolicy::always;
    m = error_of([&] { Loader l(co, Communicator::world()); });
    EXPECT_NE(m.find("synthetic-train.h5: reading /images (truncated or corrupt data?) failed"), std::string::npos) << m;
    // Per-batch reads hit it in the prefetch thread: next() rethrows it on the consumer's thread.
    co.cache = CachePolicy::never;
    co.shuffle = false;
    m = error_of([&] {
      Loader l(co, Communicator::world());
      while (l.next()) {
      }
    });
    EXPECT_NE(m.find("synthetic-train.h5: reading /images samples ["), std::string::npos) << m;
  }
  // find_split_files on an empty directory.
  std::filesystem::create_directories(dir / "empty");
  m = error_of([&] { find_split_files(dir / "empty", "train"); });
  EXPECT_NE(m.find("empty: no '*-train.h5'"), std::string::npos) << m;
}
