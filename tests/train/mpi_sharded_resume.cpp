// The sharded read of a checkpoint (checkpoint/read.hpp): each rank reads only
// what it restores. Checked against tests/support/checkpoint_reference.hpp,
// which reads every tensor whole (H5Dread, and the parts assembled with nn's
// place_shard), sliced with shard_of: the independent reference. ringtrain's
// own whole-tensor read_checkpoint (the same reader) equals it bitwise.
//  - Checkpoints of a tiny vit + AdamW written at data W (parts, and one
//    file), tensor 2, pipeline 2 x tensor 2 with ZeRO-1 and data 3 with ZeRO-1
//    are read into the targets of other layouts — tensor 1..4 split along the
//    first or the last dimension (3 blocks for q|k|v along the first),
//    optimizer state in ZeRO-1-like slices — bitwise the reference, reading
//    exactly the targets' bytes; every stored byte is verified by exactly one
//    rank.
//  - A trainer resumed at tensor 2, pipeline 2 and ZeRO-1 from a data-W
//    checkpoint holds the reference's shards of every parameter; it read
//    exactly the state it holds (its share), and verified about 1/W of the
//    checkpoint.
//  - A weights-only load (eval, generate) reads no optimizer byte: it loads a
//    checkpoint whose optimizer state is corrupt throughout; `generate`'s
//    configuration comes from the head alone.
//  - A corrupt piece (a flipped byte, a NaN) is an error on every rank naming
//    the part file and the tensor, before anything is restored; a file that
//    another tool rewrote chunked and compressed reads through HDF5 alike.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "fixtures.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/checkpoint/read.hpp"
#include "ringtrain/train/trainer.hpp"
#include "support/checkpoint_reference.hpp"
#include "support/error_of.hpp"

using namespace ringtrain;
using test_support::error_of;
namespace fs = std::filesystem;

namespace {

struct Written {
  const char* name;
  int pipeline, tensor;
  int zero;  // parallel.zero
  bool parallel;
};

TrainConfig vit_config(const std::string& data, const std::string& dir) {
  TrainConfig c = test_fixtures::small_config(data);
  c.model.name = "vit";
  c.model.width = 24;  // q|k|v [72, 24]: 3 blocks of 24 rows, split by 1..4 tensor ranks
  c.model.heads = 4;
  c.model.depth = 2;
  c.model.mlp_ratio = 2.0;
  c.model.patch = 7;
  c.parallel.partition = "params";  // pipeline stages of about equal state
  c.data.global_batch = 24;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 1e-3;
  c.checkpoint.dir = dir;
  c.train.max_steps = 2;  // the moments are not zero
  return c;
}

// The element range [begin, begin + n) of `whole`'s part as `place` says (the reference).
Tensor reference(const Tensor& whole, const PiecePlace& place, std::int64_t n) {
  Tensor part = place.shard.sharded() ? shard_of(whole, place.shard) : whole;
  return part.reshape({part.numel()}).flat_view(place.begin, n).clone();
}

// The targets of a layout no trainer built: `tensor` parts, each tensor split
// along its first (or last) dimension that tensor x blocks divide (3 blocks for
// q|k|v along the first), else replicated; this rank takes part rank % tensor,
// and of optimizer state a ZeRO-1-like slice of that part.
std::vector<ReadTarget> virtual_targets(const CheckpointData& whole, int tensor, bool first_dim, int rank, int size) {
  std::vector<ReadTarget> out;
  for (const auto& [name, t] : whole.tensors) {
    PiecePlace p;
    p.whole = t.shape();
    const int nd = t.ndim();
    for (int i = 0; i < nd && tensor > 1; ++i) {
      const int d = first_dim ? i : nd - 1 - i;
      const int blocks = d == 0 && name.find("qkv") != std::string::npos ? 3 : 1;
      if (t.shape()[static_cast<std::size_t>(d)] % (tensor * blocks) == 0) {
        p.shard = make_shard(t.shape(), d, tensor, rank % tensor, blocks);
        break;
      }
    }
    const std::int64_t part = p.shard.sharded() ? t.numel() / tensor : t.numel();
    std::int64_t lo = 0, hi = part;
    if (name.rfind("optim/", 0) == 0 && name != "optim/step") {
      const int slices = std::max(1, size / tensor), k = (rank / tensor) % slices;
      lo = part * k / slices;
      hi = part * (k + 1) / slices;
    }
    p.begin = lo;
    Tensor dst = Tensor::empty({hi - lo}, t.dtype());
    if (dst.nbytes()) std::memset(dst.raw(), 0xab, dst.nbytes());
    out.push_back({name, dst, p});
  }
  return out;
}

// The independent reference's whole tensors.
CheckpointData reference_whole(const std::string& path) {
  CheckpointData d;
  for (auto& [n, t] : test_support::reference_tensors(path)) d.tensors.emplace_back(n, t);
  return d;
}

std::size_t sum_over(std::size_t v, const Communicator& w) {
  std::uint64_t x = v;
  allreduce(&x, &x, 1, DType::i64, ReduceOp::sum, w);
  return static_cast<std::size_t>(x);
}

std::size_t max_over(std::size_t v, const Communicator& w) {
  std::uint64_t x = v;
  allreduce(&x, &x, 1, DType::i64, ReduceOp::max, w);
  return static_cast<std::size_t>(x);
}

class ShardedResume : public test_fixtures::SyntheticDataTest {
 protected:
  ShardedResume() : SyntheticDataTest("sharded", 256, 32) {}

  // The checkpoint a run at `l` writes after 2 steps (on every rank: its path).
  std::string write(const Written& l) {
    TrainConfig c = vit_config(data_, data_ + "/" + l.name);
    c.parallel.pipeline = l.pipeline;
    c.parallel.tensor = l.tensor;
    c.parallel.zero = l.zero;
    c.checkpoint.parallel = l.parallel;
    Trainer t(c, world_, test_fixtures::quiet_hooks());
    t.fit();
    world_.barrier();
    return checkpoint_candidates(c.checkpoint.dir).front();
  }

  std::vector<Written> writers() const {
    const int w = world_.size();
    std::vector<Written> v = {{"data-parts", 1, 1, false, true}, {"data-one-file", 1, 1, false, false}};
    if (w % 2 == 0) v.push_back({"tensor2", 1, 2, false, true});
    if (w % 2 == 0) v.push_back({"tensor2-zero2", 1, 2, 2, true});
    if (w % 2 == 0) v.push_back({"tensor2-zero3", 1, 2, 3, true});
    if (w > 1) v.push_back({"data-zero3-one-file", 1, 1, 3, false});  // gathered whole on rank 0
    if (w == 4) v.push_back({"pipeline2-tensor2-zero", 2, 2, 1, true});
    if (w == 4) v.push_back({"pipeline2-zero3", 2, 1, 3, true});
    if (w == 3) v.push_back({"data3-zero", 1, 1, 1, true});
    if (w == 3) v.push_back({"data3-zero2", 1, 1, 2, true});
    return v;
  }
};

TEST_F(ShardedResume, ReadsAtAnyLayoutAreTheWholeTensorsSliced) {
  for (const Written& l : writers()) {
    SCOPED_TRACE(l.name);
    const std::string path = write(l);
    const CheckpointData whole = reference_whole(path);
    const CheckpointIndex ix = read_checkpoint_index(path, world_);
    EXPECT_EQ(ix.files.size(), l.parallel && world_.size() > 1 ? static_cast<std::size_t>(world_.size()) : 1u);
    std::size_t whole_bytes = 0;
    for (const auto& [n, t] : whole.tensors) whole_bytes += t.nbytes();
    EXPECT_EQ(ix.bytes(), whole_bytes);
    // Every stored byte verified by exactly one rank, in about equal shares.
    const CheckpointReadStats v = verify_checkpoint(ix, world_);
    EXPECT_EQ(sum_over(v.verified_bytes, world_), whole_bytes);
    std::size_t largest = 0;
    for (const auto& p : ix.pieces) largest = std::max(largest, static_cast<std::size_t>(p.numel) * dtype_size(p.dtype));
    EXPECT_LE(v.verified_bytes, whole_bytes / world_.size() + largest);

    std::map<std::string, Tensor> by_name(whole.tensors.begin(), whole.tensors.end());
    const CheckpointData own = read_checkpoint(path);  // ringtrain's whole-tensor read: the reference, bitwise
    ASSERT_EQ(own.tensors.size(), by_name.size());
    for (const auto& [n, t] : own.tensors) {
      ASSERT_EQ(by_name.count(n), 1u) << n;
      const Tensor& ref = by_name.at(n);
      ASSERT_EQ(t.shape(), ref.shape()) << n;
      EXPECT_EQ(std::memcmp(t.raw(), ref.raw(), t.nbytes()), 0) << n;
    }
    for (int tensor : {1, 2, 3, 4})
      for (bool first_dim : {true, false}) {
        SCOPED_TRACE(cat("read at tensor ", tensor, first_dim ? ", first dimension" : ", last dimension"));
        std::vector<ReadTarget> ts = virtual_targets(whole, tensor, first_dim, world_.rank(), world_.size());
        ts.push_back({"amp.loss_scale", Tensor::empty({4}, DType::f64), {{4}, {}, 0}, /*optional=*/true});
        const CheckpointReadStats r = read_targets(ix, ts);
        std::size_t want_bytes = 0;
        int split = 0;
        for (const ReadTarget& t : ts) {
          if (t.optional) {
            EXPECT_FALSE(t.found) << "an fp32 run stores no loss scale";
            continue;
          }
          ASSERT_TRUE(t.found) << t.name;
          want_bytes += t.dst.nbytes();
          split += t.place.shard.sharded();
          const Tensor ref = reference(by_name.at(t.name), t.place, t.dst.numel());
          EXPECT_EQ(std::memcmp(ref.raw(), t.dst.raw(), ref.nbytes()), 0)
              << t.name << " elements " << t.place.begin << ".." << t.place.begin + t.dst.numel() << " of part "
              << t.place.shard.index << " of " << t.place.shard.parts;
        }
        EXPECT_EQ(r.restored_bytes, want_bytes) << "read exactly the targets' bytes";
        if (tensor > 1) {
          EXPECT_GT(split, 10) << "the layout splits most tensors";
        }
      }
    // A name the checkpoint lacks is an error naming it.
    std::vector<ReadTarget> missing = {{"param/nope", Tensor::empty({1}), {{1}, {}, 0}}};
    const std::string m = error_of([&] { read_targets(ix, missing); });
    EXPECT_NE(m.find("has no tensor 'param/nope'"), std::string::npos) << m;
  }
}

TEST_F(ShardedResume, AResumedRankReadsItsShareAndHoldsTheSlicedTensors) {
  const int w = world_.size();
  if (w == 1) GTEST_SKIP() << "one rank holds the whole state: it has no smaller share to read";
  const std::string path = write({"data", 1, 1, false, true});
  const CheckpointData whole = reference_whole(path);
  std::map<std::string, Tensor> by_name(whole.tensors.begin(), whole.tensors.end());
  std::size_t whole_bytes = 0, whole_params = 0, largest_piece = 0;
  int slots = 0;  // optimizer state tensors per parameter (AdamW: 2)
  for (const auto& [n, t] : whole.tensors) {
    whole_bytes += t.nbytes();
    if (n.rfind("param/", 0) == 0) whole_params += t.nbytes();
    slots += n.rfind("optim/", 0) == 0 && n.find("/patch_embed.proj.weight") != std::string::npos;
    EXPECT_NE(n.rfind("buffer/", 0), 0u) << "vit has no buffers";
  }
  ASSERT_EQ(slots, 2);
  for (const auto& p : read_checkpoint_index(path).pieces)
    largest_piece = std::max(largest_piece, static_cast<std::size_t>(p.numel) * dtype_size(p.dtype));

  struct Layout {
    const char* name;
    int pipeline, tensor;
    int zero;
  };
  std::vector<Layout> layouts = {{"ZeRO-1", 1, 1, 1}, {"ZeRO-2", 1, 1, 2}, {"ZeRO-3", 1, 1, 3}};
  if (w % 2 == 0) layouts.insert(layouts.end(), {{"tensor 2", 1, 2, false}, {"pipeline 2", 2, 1, false}});
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    TrainConfig c = vit_config(data_, data_ + "/resumed");
    c.parallel.pipeline = l.pipeline;
    c.parallel.tensor = l.tensor;
    c.parallel.zero = l.zero;
    Trainer t(c, world_, test_fixtures::quiet_hooks());
    ASSERT_TRUE(t.resume(path));
    const LoadedCheckpoint& got = t.loaded();
    EXPECT_EQ(got.file, path);
    EXPECT_EQ(got.step, 2);
    // Its parameters: the reference's shards, bitwise (ZeRO-3: gathered from the slices it read).
    const ParamArena& a = t.parameters();
    std::size_t held = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const ParamInfo& pi = a.info(i);
      const Tensor& w0 = by_name.at("param/" + pi.name);
      const Tensor ref = pi.shard.sharded() ? shard_of(w0, pi.shard) : w0;
      const Tensor mine = a.param(i);
      ASSERT_EQ(mine.numel(), ref.numel()) << pi.name;
      EXPECT_EQ(std::memcmp(mine.raw(), ref.raw(), ref.nbytes()), 0) << pi.name;
      held += mine.nbytes();
    }
    // It read exactly what it holds: parameters, their optimizer state (with
    // ZeRO-1 its slice: each element read by one rank; ZeRO-3 its slice of the
    // parameters too) and the step count.
    if (l.zero == 3) {
      EXPECT_EQ(sum_over(got.restored_bytes - 8, world_), (1 + slots) * whole_params);
      EXPECT_LE(got.restored_bytes, 8 + (1 + slots) * whole_params / w + 2 * 64 * 64);
    } else if (l.zero) {
      EXPECT_EQ(sum_over(got.restored_bytes - held - 8, world_), slots * whole_params);
      EXPECT_LE(got.restored_bytes, held + 8 + slots * whole_params / w + 64 * 64);
    } else {
      EXPECT_EQ(got.restored_bytes, held * (1 + slots) + 8);
      EXPECT_LT(got.restored_bytes, whole_bytes * 3 / 4) << "a rank read far more than its share";
    }
    // And verified about 1/W of the checkpoint: every byte once over the ranks.
    EXPECT_EQ(sum_over(got.verified_bytes, world_), whole_bytes);
    EXPECT_LE(max_over(got.verified_bytes, world_), whole_bytes / w + largest_piece);
    std::printf("[ sharded  ] rank %d, %s: restored %zu B (holds %zu B of parameters), verified %zu B, of %zu B\n",
                world_.rank(), l.name, got.restored_bytes, held, got.verified_bytes, whole_bytes);
  }
}

// Flips a byte in the middle of piece `p`'s data.
void corrupt(const CheckpointIndex& ix, const StoredPiece& p) {
  const std::string& f = ix.files[static_cast<std::size_t>(p.file)];
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  const auto at = static_cast<std::streamoff>(p.offset + p.numel * static_cast<std::int64_t>(dtype_size(p.dtype)) / 2);
  io.seekg(at);
  char c = 0;
  io.read(&c, 1);
  c ^= 0x5a;
  io.seekp(at);
  io.write(&c, 1);
}

TEST_F(ShardedResume, ACorruptPieceIsNamedOnEveryRankBeforeAnythingIsRestored) {
  const int w = world_.size();
  for (const Written& l : {Written{"parts", 1, 1, false, true}, Written{"one-file", 1, 1, false, false}}) {
    if (w == 1 && l.parallel) continue;  // one rank writes one file
    SCOPED_TRACE(l.name);
    const std::string path = write(l);
    const CheckpointIndex ix = read_checkpoint_index(path);
    // The last file's largest piece (verified by the last rank, as it wrote it).
    const StoredPiece* target = nullptr;
    for (const auto& p : ix.pieces)
      if (p.file == static_cast<int>(ix.files.size()) - 1 && (!target || p.numel > target->numel)) target = &p;
    ASSERT_NE(target, nullptr);
    const std::string file = fs::path(ix.files[static_cast<std::size_t>(target->file)]).filename().string();
    world_.barrier();
    if (world_.rank() == 0) corrupt(ix, *target);
    world_.barrier();
    TrainConfig c = vit_config(data_, data_ + "/resumed-" + l.name);
    c.parallel.tensor = w % 2 == 0 ? 2 : 1;
    Trainer t(c, world_, test_fixtures::quiet_hooks());
    const Tensor before = t.parameters().param(0).clone();
    const std::string m = error_of([&] { t.resume(path); });
    EXPECT_NE(m.find("no usable checkpoint"), std::string::npos) << m;
    EXPECT_NE(m.find("fails its checksum"), std::string::npos) << m;
    EXPECT_NE(m.find("tensor '" + target->name + "'"), std::string::npos) << m;
    EXPECT_NE(m.find(l.parallel ? "part file '" + file + "'" : path), std::string::npos) << m;
    EXPECT_EQ(std::memcmp(before.raw(), t.parameters().param(0).raw(), before.nbytes()), 0)
        << "a corrupt checkpoint changed the parameters";
  }
  // A NaN with a valid checksum (a diverged run): named with its element.
  if (w > 1) {
    const std::string path = write({"nan", 1, 1, false, true});
    world_.barrier();
    if (world_.rank() == 0) {
      CheckpointData part = read_checkpoint_file(read_checkpoint_index(path).files.back());
      for (auto& [n, t] : part.tensors)
        if (n.rfind("optim/exp_avg_sq/", 0) == 0 && t.numel() > 3) {
          t.data<float>()[3] = std::numeric_limits<float>::infinity();
          break;
        }
      write_checkpoint(read_checkpoint_index(path).files.back(), part);
    }
    world_.barrier();
    Trainer t(vit_config(data_, data_ + "/resumed-nan"), world_, test_fixtures::quiet_hooks());
    const std::string m = error_of([&] { t.resume(path); });
    EXPECT_NE(m.find("holds NaN or Inf (element "), std::string::npos) << m;
    EXPECT_NE(m.find("tensor 'optim/exp_avg_sq/"), std::string::npos) << m;
  }
}

// eval and generate load weights only: they read (to verify and to restore)
// the parameters and buffers and no byte of the optimizer state, which here is
// corrupt in every piece; a resume, which needs it, names the corruption. The
// configuration `generate` builds its model from is read from the head alone,
// with every tensor of the checkpoint corrupt.
TEST_F(ShardedResume, WeightsOnlyLoadsReadNoOptimizerByte) {
  const int w = world_.size();
  const std::string path = write({"weights-only", 1, 1, false, true});
  const CheckpointData whole = reference_whole(path);
  const std::string config = read_checkpoint(path).config_toml;
  std::map<std::string, Tensor> by_name(whole.tensors.begin(), whole.tensors.end());
  const CheckpointIndex ix = read_checkpoint_index(path);
  std::size_t weights = 0, optim = 0;
  for (const StoredPiece& p : ix.pieces) {
    const std::size_t b = static_cast<std::size_t>(p.numel) * dtype_size(p.dtype);
    if (p.name.rfind("optim/", 0) == 0) optim += b;
    else if (p.name.rfind("param/", 0) == 0 || p.name.rfind("buffer/", 0) == 0) weights += b;
  }
  ASSERT_GT(optim, weights) << "AdamW holds two moments per parameter";
  world_.barrier();
  if (world_.rank() == 0)
    for (const StoredPiece& p : ix.pieces)
      if (p.name.rfind("optim/", 0) == 0 && p.numel > 0) corrupt(ix, p);
  world_.barrier();
  {
    Trainer t(vit_config(data_, data_ + "/weights-only-eval"), world_, test_fixtures::quiet_hooks());
    const LoadedCheckpoint got = t.load_weights(path);
    // Every parameter byte verified once over the ranks, every rank restoring its replica: no optimizer byte read.
    EXPECT_EQ(sum_over(got.verified_bytes, world_), weights);
    EXPECT_EQ(got.restored_bytes, weights);
    const ParamArena& a = t.parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const Tensor& ref = by_name.at("param/" + a.info(i).name);
      ASSERT_EQ(a.param(i).numel(), ref.numel());
      EXPECT_EQ(std::memcmp(a.param(i).raw(), ref.raw(), ref.nbytes()), 0) << a.info(i).name;
    }
  }
  Trainer r(vit_config(data_, data_ + "/weights-only-resume"), world_, test_fixtures::quiet_hooks());
  const std::string m = error_of([&] { r.resume(path); });
  EXPECT_NE(m.find("fails its checksum"), std::string::npos) << m;
  EXPECT_NE(m.find("tensor 'optim/"), std::string::npos) << m;
  world_.barrier();
  if (world_.rank() == 0)
    for (const StoredPiece& p : ix.pieces)
      if (p.name.rfind("optim/", 0) != 0 && p.numel > 0) corrupt(ix, p);
  world_.barrier();
  const FoundCheckpoint head = find_checkpoint_head(path);
  EXPECT_EQ(head.path, path);
  EXPECT_EQ(head.data.config_toml, config);
  EXPECT_TRUE(head.data.tensors.empty());
  EXPECT_EQ(head.data.parts.size(), w > 1 ? static_cast<std::size_t>(w) : 0u);
  EXPECT_NE(error_of([&] { find_intact_checkpoint(path); }).find("fails its checksum"), std::string::npos);
}

// h5repack rewrites every dataset chunked and compressed: no byte offsets, so
// each piece is read whole through HDF5, with the same result.
TEST_F(ShardedResume, FilesRewrittenChunkedReadThroughHdf5) {
  if (std::system("command -v h5repack > /dev/null 2>&1") != 0) GTEST_SKIP() << "h5repack (hdf5-tools) is missing";
  const std::string path = write({"repacked", 1, 1, false, true});
  const CheckpointData whole = reference_whole(path);
  world_.barrier();
  if (world_.rank() == 0)
    for (const std::string& f : read_checkpoint_index(path).files) {
      const std::string tmp = f + ".gz.h5";
      ASSERT_EQ(std::system(("h5repack -m 1 -f GZIP=1 '" + f + "' '" + tmp + "'").c_str()), 0) << f;
      fs::rename(tmp, f);
    }
  world_.barrier();
  const CheckpointIndex ix = read_checkpoint_index(path, world_);
  std::size_t through_hdf5 = 0;
  for (const auto& p : ix.pieces) through_hdf5 += p.offset < 0;
  EXPECT_GT(through_hdf5, ix.pieces.size() / 2) << "h5repack left the datasets contiguous";
  EXPECT_EQ(sum_over(verify_checkpoint(ix, world_).verified_bytes, world_), ix.bytes());
  std::vector<ReadTarget> ts = virtual_targets(whole, 2, true, world_.rank(), world_.size());
  read_targets(ix, ts);
  std::map<std::string, Tensor> by_name(whole.tensors.begin(), whole.tensors.end());
  for (const ReadTarget& t : ts) {
    const Tensor ref = reference(by_name.at(t.name), t.place, t.dst.numel());
    EXPECT_EQ(std::memcmp(ref.raw(), t.dst.raw(), ref.nbytes()), 0) << t.name;
  }
}

}  // namespace
