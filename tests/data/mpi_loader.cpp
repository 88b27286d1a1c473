// Multi-rank loader tests (1-4 ranks): every sample exactly once per epoch
// across ranks in both layouts and both shuffle modes, the rank-block
// exactness (p ranks × b == 1 rank × p·b, pixels included, augmentation on),
// MPI-IO collective reads against independent reads, collective prepare, and
// errors raised on every rank when one rank's input is bad.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "fixtures.hpp"
#include "support/error_of.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/data/loader.hpp"
#include "ringtrain/data/prepare.hpp"

using namespace ringtrain;
using test_support::error_of;
using namespace ringtrain::data;

namespace {

Communicator world() { return Communicator::world(); }

// A directory every rank names the same (rank 0's pid); rank 0 removes it.
struct SharedDir {
  std::filesystem::path path;
  explicit SharedDir(const std::string& tag) {
    long long pid = ::getpid();
    MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    path = std::filesystem::temp_directory_path() / ("rt_mpidata_" + tag + "_" + std::to_string(pid));
  }
  ~SharedDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    std::error_code ec;
    if (r == 0) std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& n) const { return (path / n).string(); }
};

PreparedDataset ids_fixture(const std::string& out, std::int64_t n, int shards, int chunk = 6) {
  SyntheticOptions o;
  o.output = out;
  o.name = "ids";
  o.train_samples = n;
  o.channels = 1, o.height = 4, o.width = 4;
  o.num_classes = 5;
  o.seed = 21;
  o.embed_index = true;
  o.storage.num_shards = shards;
  o.storage.chunk_samples = chunk;
  return generate_synthetic(o, world());
}

std::int64_t decoded_id(const float* img) {
  std::uint64_t v = 0;
  for (int q = 0; q < 8; ++q) v |= std::uint64_t(std::lround(img[q])) << (8 * q);
  return std::int64_t(v);
}

// All ranks' vectors, concatenated in rank order.
std::vector<std::int64_t> allgather(const std::vector<std::int64_t>& mine) {
  int p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  int n = int(mine.size());
  std::vector<int> counts(p), displs(p);
  MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::partial_sum(counts.begin(), counts.end() - 1, displs.begin() + 1);
  std::vector<std::int64_t> all(std::size_t(std::accumulate(counts.begin(), counts.end(), 0)));
  MPI_Allgatherv(mine.data(), n, MPI_INT64_T, all.data(), counts.data(), displs.data(), MPI_INT64_T, MPI_COMM_WORLD);
  return all;
}


}  // namespace

TEST(MpiLoader, EverySampleExactlyOncePerEpochInBothLayouts) {
  SharedDir dir("cover");
  const int p = world().size(), r = world().rank();
  const std::int64_t N = 12 * 9 + 5;  // 113: not a multiple of any global batch
  for (int shards : {1, 4}) {
    auto ds = ids_fixture(dir / ("k" + std::to_string(shards)), N, shards);
    for (auto tail : {TailPolicy::pad, TailPolicy::drop_last}) {
      for (auto cache : {CachePolicy::never, CachePolicy::always}) {
        LoaderOptions o;
        o.files = ds.train_files;
        o.batch_size = 5;
        o.seed = 8;
        o.tail = tail;
        o.cache = cache;
        o.normalize = false;
        Loader l(o, world());
        long long steps = l.steps_per_epoch(), lo = 0, hi = 0;
        MPI_Allreduce(&steps, &lo, 1, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(&steps, &hi, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
        ASSERT_EQ(lo, hi) << "ranks must agree on the steps per epoch";
        for (int epoch : {0, 1}) {
          l.set_epoch(epoch);
          std::vector<std::int64_t> mine;
          std::int64_t n = 0;
          while (auto b = l.next()) {
            ++n;
            for (std::int64_t i = 0; i < 5; ++i) {
              ASSERT_EQ(decoded_id(b->images.data<float>() + i * 16), (*b->ids)[i]) << "rank " << r;
              if (i < b->valid) mine.push_back((*b->ids)[i]);
            }
          }
          ASSERT_EQ(n, steps);
          auto all = allgather(mine);
          std::vector<int> seen(N, 0);
          for (auto id : all) seen[id]++;
          const std::int64_t G = 5 * p;
          for (std::int64_t i = 0; i < N; ++i) ASSERT_LE(seen[i], 1) << "sample " << i << " read twice";
          EXPECT_EQ(std::int64_t(all.size()), tail == TailPolicy::pad ? N : N / G * G)
              << "shards " << shards << " epoch " << epoch;
        }
      }
    }
  }
}

TEST(MpiLoader, ShardLocalShufflingReadsOnlyTheRanksShards) {
  SharedDir dir("local");
  const int p = world().size(), r = world().rank();
  auto ds = ids_fixture(dir.path.string(), 12 * 7, 12);  // 12 shards of 7: divisible by 1..4 ranks
  LoaderOptions o;
  o.files = ds.train_files;
  o.batch_size = 3;
  o.shuffle_mode = ShuffleMode::shard_local;
  o.tail = TailPolicy::pad;
  Loader l(o, world());
  EXPECT_EQ(l.steps_per_epoch(), (12 / p * 7 + 2) / 3);
  std::vector<std::int64_t> mine;
  while (auto b = l.next())
    for (std::int64_t i = 0; i < b->valid; ++i) {
      std::int64_t id = (*b->ids)[i];
      ASSERT_EQ((id / 7) % p, r) << "sample " << id << " is not in a shard of rank " << r;
      mine.push_back(id);
    }
  auto all = allgather(mine);
  std::sort(all.begin(), all.end());
  std::vector<std::int64_t> want(12 * 7);
  std::iota(want.begin(), want.end(), 0);
  // Equal shard counts per rank: no padding wrap, every sample exactly once.
  if (12 / p * 7 % 3 == 0) {
    EXPECT_EQ(all, want);
  }
  EXPECT_TRUE(std::adjacent_find(all.begin(), all.end()) == all.end());
}

TEST(MpiLoader, RankBatchesConcatenateToTheOneRankBatch) {
  SharedDir dir("exact");
  const int p = world().size(), r = world().rank();
  SyntheticOptions so;
  so.output = dir.path.string();
  so.train_samples = 150;
  so.channels = 2, so.height = 6, so.width = 6;
  so.num_classes = 3;
  so.storage.num_shards = 2;
  auto ds = generate_synthetic(so, world());
  const std::int64_t b = 4, sb = 72;
  LoaderOptions o;
  o.files = ds.train_files;
  o.seed = 77;
  o.augment = {1, true};
  o.batch_size = b;
  Loader many(o, world());
  Communicator self = world().split(r, 0, "self");
  o.batch_size = p * b;
  std::unique_ptr<Loader> one;
  if (r == 0) one = std::make_unique<Loader>(o, self);
  for (std::int64_t epoch : {0, 3}) {
    many.set_epoch(epoch);
    if (one) one->set_epoch(epoch);
    while (auto mb = many.next()) {
      std::vector<float> img(std::size_t(p * b * sb));
      std::vector<std::int64_t> lab(std::size_t(p * b));
      MPI_Gather(mb->images.raw(), int(b * sb), MPI_FLOAT, img.data(), int(b * sb), MPI_FLOAT, 0, MPI_COMM_WORLD);
      MPI_Gather(mb->labels.raw(), int(b), MPI_INT64_T, lab.data(), int(b), MPI_INT64_T, 0, MPI_COMM_WORLD);
      if (!one) continue;
      auto ob = one->next();
      ASSERT_TRUE(ob) << "the 1-rank loader ended early at step " << mb->step;
      ASSERT_EQ(ob->step, mb->step);
      ASSERT_EQ(std::memcmp(ob->images.raw(), img.data(), img.size() * 4), 0) << "step " << mb->step;
      ASSERT_EQ(std::memcmp(ob->labels.raw(), lab.data(), lab.size() * 8), 0) << "step " << mb->step;
    }
    if (one) {
      EXPECT_FALSE(one->next()) << "the 1-rank loader has more steps";
    }
  }
}

TEST(MpiLoader, MpiIoCollectiveReadsMatchIndependentReads) {
  SharedDir dir("mpio");
  LoaderOptions o;
  // Chunks of 6 images or contiguous (-1): one collective read per batch (a union); chunks of 1: b reads.
  for (int chunk : {6, 1, -1}) {
    auto ds = ids_fixture(dir / ("c" + std::to_string(chunk)), 97, 1, chunk);
    o = LoaderOptions{};
    o.files = ds.train_files;
    o.batch_size = 3;
    o.seed = 5;
    o.cache = CachePolicy::never;
    Loader plain(o, world());
    o.mpio = true;
    Loader coll(o, world());
    EXPECT_FALSE(coll.cached());
    for (std::int64_t epoch : {0, 1, 2}) {
      plain.set_epoch(epoch);
      coll.set_epoch(epoch);
      std::int64_t step = 0;
      while (auto a = plain.next()) {
        auto c = coll.next();
        ASSERT_TRUE(c);
        ASSERT_EQ(*a->ids, *c->ids);
        ASSERT_EQ(std::memcmp(a->images.raw(), c->images.raw(), a->images.nbytes()), 0);
        ASSERT_EQ(std::memcmp(a->labels.raw(), c->labels.raw(), a->labels.nbytes()), 0);
        // Epoch 1 is abandoned after 2 steps on every rank: the collective reads must drain, not hang.
        if (epoch == 1 && ++step == 2) break;
      }
      if (epoch != 1) {
        EXPECT_FALSE(coll.next());
      }
    }
  }
  o.mpio = true;
  o.files = ids_fixture(dir / "sharded", 20, 2).train_files;
  std::string m = error_of([&] { Loader l(o, world()); });
  EXPECT_NE(m.find("MPI-IO collective reads need the single-file layout"), std::string::npos) << m;
}

TEST(MpiLoader, CollectivePrepareWritesOneShardPerRank) {
  SharedDir dir("prep");
  const int p = world().size();
  if (world().rank() == 0) {
    std::filesystem::create_directories(dir.path / "raw");
    rtfix::write_idx_pair(dir / "raw/train-images-idx3-ubyte.gz", dir / "raw/train-labels-idx1-ubyte.gz", 41, 3, 3,
                          true);
    rtfix::write_idx_pair(dir / "raw/t10k-images-idx3-ubyte", dir / "raw/t10k-labels-idx1-ubyte", 9, 3, 3, false);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  PrepareOptions o;
  o.input = dir / "raw";
  o.output = dir / "out";
  o.storage.num_shards = 0;  // one per rank
  auto out = prepare_dataset(o, world());
  ASSERT_EQ(int(out.train_files.size()), p);
  std::vector<std::uint8_t> px;
  for (auto& f : out.train_files) {
    auto v = rtfix::h5_read_u8(f, "images");
    px.insert(px.end(), v.begin(), v.end());
  }
  ASSERT_EQ(px.size(), 41u * 9);
  for (std::uint32_t i = 0; i < 41; ++i)
    for (std::uint32_t j = 0; j < 9; ++j) ASSERT_EQ(px[i * 9 + j], (i * 7 + j * 3) % 256);
  EXPECT_EQ(find_split_files(dir / "out", "train"), out.train_files);
}

TEST(MpiLoader, BadInputOnOneRankFailsEveryRank) {
  SharedDir dir("bad");
  const int p = world().size(), r = world().rank();
  auto ds = ids_fixture(dir / "ok", 3, 1);
  auto big = ids_fixture(dir / "big", 40, 2);
  LoaderOptions o;
  o.files = r == p - 1 ? std::vector<std::string>{dir / "missing.h5"} : big.train_files;
  o.batch_size = 1;
  std::string m = error_of([&] { Loader l(o, world()); });
  EXPECT_NE(m.find("missing.h5: file not found"), std::string::npos) << m;
  if (p > 1) {
    EXPECT_NE(m.find("failed on rank " + std::to_string(p - 1)), std::string::npos) << m;
  }
  // Fewer samples than ranks (3 samples; only fails at 4 ranks), and a global batch too large.
  o.files = ds.train_files;
  m = error_of([&] { Loader l(o, world()); });
  if (p > 3) {
    EXPECT_NE(m.find("fewer samples (3) than ranks (4)"), std::string::npos) << m;
    EXPECT_NE(m.find("ids-train.h5"), std::string::npos) << m;
  } else {
    EXPECT_EQ(m, "<no error>");
  }
  o.batch_size = 2;
  m = error_of([&] { Loader l(o, world()); });
  if (p == 2 || p == 3) {
    EXPECT_NE(m.find("batch larger than the data set"), std::string::npos) << m;
  }
}
