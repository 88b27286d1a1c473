// Configuration parsing/validation and HDF5 checkpoint round trips.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <chrono>
#include <fstream>
#include <functional>
#include <thread>

#include "ringtrain/core/error.hpp"
#include <hdf5.h>
#include <sys/mount.h>

#include <cmath>
#include <limits>

#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/checkpoint/read.hpp"
#include "ringtrain/train/config.hpp"
#include "ringtrain/train/gpu_gate.hpp"
#include "support/error_of.hpp"
#include "../../src/train/run_state.hpp"

using namespace ringtrain;
using test_support::error_of;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("rt-" + tag + "-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}


CheckpointData sample_data() {
  Tensor a = Tensor::empty({5}, DType::f32);
  Tensor b = Tensor::empty({3}, DType::bf16);
  Tensor c = Tensor::empty({2}, DType::i64);
  Tensor w = Tensor::empty({2, 3}, DType::f32);
  for (int i = 0; i < 5; ++i) a.data<float>()[i] = 0.1f * i - 0.3f;
  for (int i = 0; i < 3; ++i) b.data<bfloat16>()[i] = to_bf16(1.5f * i);
  for (int i = 0; i < 6; ++i) w.data<float>()[i] = static_cast<float>(i);
  c.data<std::int64_t>()[0] = -7;
  c.data<std::int64_t>()[1] = 1LL << 40;
  CheckpointData data;
  data.tensors = {{"param/fc.bias", a}, {"optim/momentum/fc.bias", b}, {"rng", c}, {"param/fc.weight", w}};
  data.scalars = {{"epoch", 3}, {"step", 1234}};
  data.strings = {{"run_id", "r1"}};
  data.config_toml = "[model]\nname = \"cnn\"\n";
  return data;
}

std::size_t count_files(const fs::path& d, const std::string& needle) {
  std::size_t n = 0;
  for (auto& f : fs::directory_iterator(d)) n += f.path().filename().string().find(needle) != std::string::npos;
  return n;
}

// Overwrites a file's bytes at `offset` (a corrupted sector).
void flip_byte(const fs::path& f, std::uintmax_t offset) {
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(offset));
  char ch = 0;
  io.read(&ch, 1);
  ch = static_cast<char>(ch ^ 0x5a);
  io.seekp(static_cast<std::streamoff>(offset));
  io.write(&ch, 1);
}

// Byte offset of a float32 dataset's data in the file (contiguous layout).
std::uintmax_t dataset_offset(const fs::path& f, const char* name) {
  hid_t file = H5Fopen(f.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(file, name, H5P_DEFAULT);
  haddr_t off = H5Dget_offset(ds);
  H5Dclose(ds);
  H5Fclose(file);
  return static_cast<std::uintmax_t>(off);
}

}  // namespace

TEST(Config, LoadsTomlAndOverrides) {
  auto d = temp_dir("cfg");
  std::ofstream(d / "a.toml") << "[model]\nname = \"resnet\"\ndepth = 32\n[optimizer]\nlr = 0.2\nnesterov = true\n"
                                 "[comm]\nfusion_threshold = 1024\n";
  TrainConfig c;
  c.load_toml((d / "a.toml").string());
  EXPECT_EQ(c.model.name, "resnet");
  EXPECT_EQ(c.model.depth, 32);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.2);
  EXPECT_TRUE(c.optimizer.nesterov);
  EXPECT_EQ(c.comm.fusion_threshold, 1024);
  c.set("data.batch_size=16");
  c.set("optimizer.lr=0.5");
  c.set("log.metrics=");
  EXPECT_EQ(c.data.batch_size, 16);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_EQ(c.log.metrics, "");
  c.validate();

  // to_toml() reproduces the same configuration.
  std::ofstream(d / "b.toml") << c.to_toml();
  TrainConfig back;
  back.load_toml((d / "b.toml").string());
  EXPECT_EQ(back.to_toml(), c.to_toml());
  fs::remove_all(d);
}

// Floats print in their shortest round-trip form, as the user wrote them, and
// read back bit for bit (whole numbers stay TOML floats).
TEST(Config, FloatsPrintShortestAndRoundTrip) {
  auto d = temp_dir("cfgfloat");
  TrainConfig c;
  c.optimizer.lr = 0.05;
  c.optimizer.weight_decay = 5e-4;
  c.optimizer.eps = 1e-8;
  c.optimizer.beta2 = 0.1 + 0.2;  // 0.30000000000000004: shortest is not always short
  c.comm.collective_timeout_s = 300;
  const std::string t = c.to_toml();
  EXPECT_NE(t.find("\nlr = 0.05\n"), std::string::npos) << t;
  EXPECT_NE(t.find("weight_decay = 0.0005\n"), std::string::npos) << t;
  EXPECT_NE(t.find("eps = 1e-08\n"), std::string::npos) << t;
  EXPECT_NE(t.find("beta2 = 0.30000000000000004\n"), std::string::npos) << t;
  EXPECT_NE(t.find("collective_timeout_s = 300.0\n"), std::string::npos) << t;
  EXPECT_EQ(t.find("0.050000000000000003"), std::string::npos) << t;
  std::ofstream(d / "f.toml") << t;
  TrainConfig back;
  back.load_toml((d / "f.toml").string());
  EXPECT_EQ(back.optimizer.lr, c.optimizer.lr);
  EXPECT_EQ(back.optimizer.weight_decay, c.optimizer.weight_decay);
  EXPECT_EQ(back.optimizer.eps, c.optimizer.eps);
  EXPECT_EQ(back.optimizer.beta2, c.optimizer.beta2);
  EXPECT_EQ(back.comm.collective_timeout_s, 300.0);
  fs::remove_all(d);
}

TEST(Config, ErrorsNameTheKeyAndTheFile) {
  auto d = temp_dir("cfgbad");
  std::ofstream(d / "typo.toml") << "[optimizer]\nlearning_rate = 0.1\n";
  std::string m = error_of([&] { TrainConfig c; c.load_toml((d / "typo.toml").string()); });
  EXPECT_NE(m.find("optimizer.learning_rate"), std::string::npos) << m;
  EXPECT_NE(m.find("typo.toml"), std::string::npos) << m;

  std::ofstream(d / "type.toml") << "[data]\nbatch_size = \"big\"\n";
  m = error_of([&] { TrainConfig c; c.load_toml((d / "type.toml").string()); });
  EXPECT_NE(m.find("data.batch_size"), std::string::npos) << m;
  EXPECT_NE(m.find("integer"), std::string::npos) << m;

  std::ofstream(d / "syntax.toml") << "[data\nbatch_size = 3\n";
  m = error_of([&] { TrainConfig c; c.load_toml((d / "syntax.toml").string()); });
  EXPECT_NE(m.find("syntax.toml"), std::string::npos) << m;

  m = error_of([&] { TrainConfig c; c.load_toml((d / "missing.toml").string()); });
  EXPECT_NE(m.find("missing.toml"), std::string::npos) << m;

  m = error_of([] { TrainConfig c; c.set("data.batch_size=-3"); c.validate(); });
  EXPECT_NE(m.find("data.batch_size"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("model.name=vgg"); c.validate(); });
  EXPECT_NE(m.find("vgg"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("train.epochs=ten"); });
  EXPECT_NE(m.find("train.epochs"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("nonsense"); });
  EXPECT_NE(m.find("section.key=value"), std::string::npos) << m;
  fs::remove_all(d);
}

// An unknown key suggests what it most likely meant: the same name in another
// section, a typo within a third of the key's length; nothing for a stranger.
TEST(Config, UnknownKeySuggestsTheNearestKeys) {
  std::string m = error_of([] { TrainConfig c; c.set("train.lr=0.1"); });
  EXPECT_NE(m.find("did you mean 'optimizer.lr'"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("optimizer.momentun=0.9"); });
  EXPECT_NE(m.find("did you mean 'optimizer.momentum'"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("parallel.pipline=2"); });
  EXPECT_NE(m.find("'parallel.pipeline'"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("data.bacth_size=2"); });
  EXPECT_NE(m.find("'data.batch_size'"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("zzz.qqqqqqqq=1"); });
  EXPECT_EQ(m.find("did you mean"), std::string::npos) << m;
  EXPECT_NE(m.find("known keys"), std::string::npos) << m;
  // The suggestion function alone, on a list of its own.
  const std::vector<std::string> keys = {"a.alpha", "a.beta", "b.alpha", "b.gamma"};
  EXPECT_EQ(closest_keys("c.alpha", keys), (std::vector<std::string>{"a.alpha", "b.alpha"}));
  EXPECT_EQ(closest_keys("b.gamme", keys), (std::vector<std::string>{"b.gamma"}));
  EXPECT_TRUE(closest_keys("q.omega", keys).empty());
}

// The mesh's dimensions are one table (nn/mesh_dims.hpp kDims): every row but
// data names a key the configuration accepts, mesh_shape() reads that key into
// that dimension (and no other), and the GPU gate names the dimension's feature.
TEST(Config, EveryMeshDimensionIsOneKeyReadByMeshShape) {
  for (int i = 0; i < kMeshDims; ++i) {
    const DimInfo& d = kDims[i];
    if (dim_at(i) == Dim::data) {
      EXPECT_STREQ(d.key, "") << "data is what the other dimensions leave of the world";
      continue;
    }
    TrainConfig c;
    c.set(cat(d.key, "=3"));
    const MeshShape s = c.mesh_shape();
    for (int j = 0; j < kMeshDims; ++j)
      if (dim_at(j) != Dim::data) EXPECT_EQ(s[dim_at(j)], i == j ? 3 : 1) << d.key << " read into " << kDims[j].name;
    c.train.device = "cuda";
    bool named = false;
    for (const GpuNeed& n : gpu_needs(c)) named = named || (n.feature == d.feature && n.setting == cat(d.key, " = 3"));
    EXPECT_TRUE(named) << "the GPU gate does not name " << d.feature;
  }
  EXPECT_EQ(DimSet::all().str(), "pipeline x data x expert x context x tensor");
}

// Every numeric key is range-checked with the key named: TOML integers that
// do not fit the field (no silent wrap), negatives, inf/nan from TOML and --set.
TEST(Config, NumericKeysAreRangeChecked) {
  auto d = temp_dir("cfgrange");
  auto toml_error = [&](const std::string& text) {
    std::ofstream(d / "r.toml") << text;
    return error_of([&] {
      TrainConfig c;
      c.load_toml((d / "r.toml").string());
      c.validate();
    });
  };
  std::string m = toml_error("[data]\nbatch_size = 4294967360\n");  // wraps to 64 as int32
  EXPECT_NE(m.find("data.batch_size"), std::string::npos) << m;
  EXPECT_NE(m.find("4294967360"), std::string::npos) << m;
  m = toml_error("[train]\nepochs = 2147483648\n");
  EXPECT_NE(m.find("train.epochs"), std::string::npos) << m;
  m = toml_error("[train]\nseed = -1\n");
  EXPECT_NE(m.find("train.seed"), std::string::npos) << m;
  m = toml_error("[optimizer]\nlr = inf\n");
  EXPECT_NE(m.find("optimizer.lr"), std::string::npos) << m;
  m = toml_error("[optimizer]\nmomentum = nan\n");
  EXPECT_NE(m.find("optimizer.momentum"), std::string::npos) << m;
  m = toml_error("[comm]\nstall_warning_s = -1.0\n");
  EXPECT_NE(m.find("comm.stall_warning_s"), std::string::npos) << m;
  m = toml_error("[comm]\ncollective_timeout_s = -5.0\n");
  EXPECT_NE(m.find("comm.collective_timeout_s"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("data.batch_size=99999999999"); });
  EXPECT_NE(m.find("data.batch_size"), std::string::npos) << m;
  EXPECT_NE(m.find("out of range"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("optimizer.lr=inf"); });
  EXPECT_NE(m.find("optimizer.lr"), std::string::npos) << m;
  // In-memory snapshots need checkpoint.dir (where a resume from memory puts the recovered parts).
  m = error_of([] { TrainConfig c; c.set("checkpoint.memory_every_steps=1"); c.validate(); });
  EXPECT_NE(m.find("checkpoint.memory_every_steps = 1 needs checkpoint.dir"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("checkpoint.dir=/tmp/x"); c.set("checkpoint.memory_every_steps=-1"); c.validate(); });
  EXPECT_NE(m.find("checkpoint.memory_every_steps"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("checkpoint.memory_node_ranks=-2"); c.validate(); });
  EXPECT_NE(m.find("checkpoint.memory_node_ranks"), std::string::npos) << m;
  // Each key's range, checked by validate() for values set in code.
  struct Bad { const char* key; std::function<void(TrainConfig&)> set; };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<Bad> bad = {
      {"optimizer.lr", [&](TrainConfig& c) { c.optimizer.lr = inf; }},
      {"optimizer.weight_decay", [](TrainConfig& c) { c.optimizer.weight_decay = -1e-4; }},
      {"optimizer.beta2", [](TrainConfig& c) { c.optimizer.beta2 = 1.0; }},
      {"optimizer.eps", [](TrainConfig& c) { c.optimizer.eps = 0; }},
      {"optimizer.clip_norm", [](TrainConfig& c) { c.optimizer.clip_norm = -1; }},
      {"schedule.gamma", [](TrainConfig& c) { c.schedule.gamma = std::nan(""); }},
      {"schedule.min_lr", [](TrainConfig& c) { c.schedule.min_lr = -0.1; }},
      {"comm.stall_warning_s", [](TrainConfig& c) { c.comm.stall_warning_s = -1; }},
      {"comm.stall_shutdown_s", [&](TrainConfig& c) { c.comm.stall_shutdown_s = inf; }},
      {"train.target_accuracy", [](TrainConfig& c) { c.train.target_accuracy = 1.5; }},
      {"train.verify_every", [](TrainConfig& c) { c.train.verify_every = -1; }},
      {"model.width", [](TrainConfig& c) { c.model.width = 0; }},
      {"comm.segment_bytes", [](TrainConfig& c) { c.comm.segment_bytes = 32; }},
      {"comm.tree_threshold", [](TrainConfig& c) { c.comm.tree_threshold = -1; }},
      {"comm.cache_capacity", [](TrainConfig& c) { c.comm.cache_capacity = -1; }},
      {"comm.autotune_samples", [](TrainConfig& c) { c.comm.autotune_samples = 2; }},
      {"comm.autotune_steps", [](TrainConfig& c) { c.comm.autotune_steps = 1; }},
      {"comm.autotune", [](TrainConfig& c) { c.comm.autotune = true, c.parallel.zero = 1; }},
  };
  for (auto& b : bad) {
    m = error_of([&] {
      TrainConfig c;
      b.set(c);
      c.validate();
    });
    EXPECT_NE(m.find(b.key), std::string::npos) << b.key << ": " << m;
  }
  TrainConfig ok;
  ok.validate();  // the defaults pass
  EXPECT_GT(ok.comm.stall_shutdown_s, 0) << "a stalled job must end by itself by default";
  EXPECT_GT(ok.comm.collective_timeout_s, 0);
  fs::remove_all(d);
}

TEST(Checkpoint, RoundTripIsBitwiseAndRotatesWithinOneRun) {
  auto d = temp_dir("ckpt");
  CheckpointData data = sample_data();
  CheckpointDir dir(d.string(), 2);
  // Another run's checkpoints in the same directory are never rotated away.
  dir.save("20250101-000000-aaaaaa", 7, data);
  for (int s = 1; s <= 4; ++s) dir.save("20250102-000000-bbbbbb", s * 10, data);
  EXPECT_EQ(fs::path(dir.latest()).filename(), "ckpt-20250102-000000-bbbbbb-s000000040.h5");
  EXPECT_EQ(count_files(d, "bbbbbb"), 2u);  // keep = 2 within the run
  EXPECT_EQ(count_files(d, "aaaaaa"), 1u);  // the other run untouched

  CheckpointData back = read_checkpoint(dir.latest());
  EXPECT_EQ(back.config_toml, data.config_toml);
  EXPECT_EQ(back.scalars.at("step"), 1234);
  EXPECT_EQ(back.strings.at("run_id"), "r1");
  ASSERT_EQ(back.tensors.size(), data.tensors.size());
  for (auto& [name, t] : data.tensors) {
    Tensor got = Tensor::zeros(t.shape(), t.dtype());
    restore_tensor(back, name, got);
    EXPECT_EQ(std::memcmp(t.raw(), got.raw(), t.nbytes()), 0) << name;
  }
  // Shapes are stored per tensor: a [3, 2] tensor does not take a [2, 3] one.
  Tensor wrong = Tensor::zeros({3, 2});
  std::string m = error_of([&] { restore_tensor(back, "param/fc.weight", wrong); });
  EXPECT_NE(m.find("param/fc.weight"), std::string::npos) << m;
  m = error_of([&] { restore_tensor(back, "nope", wrong); });
  EXPECT_NE(m.find("nope"), std::string::npos) << m;

  // A truncated file is reported, not crashed on.
  fs::path trunc = d / "ckpt-20250103-000000-cccccc-s000000001.h5";
  fs::copy_file(dir.latest(), trunc);
  fs::resize_file(trunc, fs::file_size(trunc) / 3);
  m = error_of([&] { read_checkpoint(trunc.string()); });
  EXPECT_NE(m.find("cccccc"), std::string::npos) << m;
  fs::remove_all(d);
}

// Corrupted tensor bytes fail the checksum naming the tensor; NaN/Inf
// parameters are refused naming the tensor; --resume DIR takes the newest
// intact checkpoint and says which it skipped and why.
TEST(Checkpoint, ChecksumsNonFiniteAndFallbackToTheNewestIntact) {
  auto d = temp_dir("ckcrc");
  CheckpointData data = sample_data();
  CheckpointDir dir(d.string(), 5);
  std::string good = dir.save("20250101-000000-aaaaaa", 1, data);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::string bad = dir.save("20250101-000000-aaaaaa", 2, data);
  flip_byte(bad, dataset_offset(bad, "/tensors/param/fc.weight") + 4);
  std::string m = error_of([&] { read_checkpoint(bad); });
  EXPECT_NE(m.find("param/fc.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("checksum"), std::string::npos) << m;

  // The sharded reader's verification (resume) says the same; its index reads no tensor data.
  m = error_of([&] { verify_checkpoint(read_checkpoint_index(bad)); });
  EXPECT_NE(m.find("param/fc.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("checksum"), std::string::npos) << m;
  EXPECT_EQ(error_of([&] { verify_checkpoint(read_checkpoint_index(good)); }), "<no error>");

  FoundCheckpoint f = find_intact_checkpoint(d.string());
  EXPECT_EQ(f.path, good);
  ASSERT_EQ(f.skipped.size(), 1u);
  EXPECT_NE(f.skipped[0].find(bad), std::string::npos) << f.skipped[0];
  EXPECT_NE(f.skipped[0].find("checksum"), std::string::npos) << f.skipped[0];

  // A diverged run's checkpoint: intact bytes, but NaN in a parameter.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CheckpointData nan = sample_data();
  nan.tensors[3].second.data<float>()[4] = std::numeric_limits<float>::quiet_NaN();
  std::string diverged = dir.save("20250101-000000-aaaaaa", 3, nan);
  f = find_intact_checkpoint(d.string());
  EXPECT_EQ(f.path, good);
  ASSERT_EQ(f.skipped.size(), 2u);
  EXPECT_NE(f.skipped[0].find("param/fc.weight"), std::string::npos) << f.skipped[0];
  EXPECT_NE(f.skipped[0].find("NaN"), std::string::npos) << f.skipped[0];
  m = error_of([&] { verify_checkpoint(read_checkpoint_index(diverged)); });
  EXPECT_NE(m.find("param/fc.weight' holds NaN or Inf (element 4)"), std::string::npos) << m;
  // Nothing usable: one error listing every reason.
  fs::remove(good);
  m = error_of([&] { find_intact_checkpoint(d.string()); });
  EXPECT_NE(m.find("checksum"), std::string::npos) << m;
  EXPECT_NE(m.find("NaN"), std::string::npos) << m;
  fs::remove_all(d);
}

// Files that are not ringtrain checkpoints of this schema are refused, saying
// what they are, by the whole-tensor reader and by the sharded reader's index;
// a directory's search lists each reason.
TEST(Checkpoint, FilesThatAreNotCheckpointsAreRefusedClearly) {
  auto d = temp_dir("ckforeign");
  auto hdf5_with_schema = [&](const fs::path& f, const char* schema) {
    hid_t file = H5Fcreate(f.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (schema) {
      hid_t type = H5Tcopy(H5T_C_S1);
      H5Tset_size(type, std::strlen(schema));
      hid_t space = H5Screate(H5S_SCALAR);
      hid_t attr = H5Acreate2(file, "schema", type, space, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(attr, type, schema);
      H5Aclose(attr);
      H5Sclose(space);
      H5Tclose(type);
    }
    H5Fclose(file);
  };
  const fs::path other = d / "ckpt-20250101-000000-aaaaaa-s000000001.h5";
  const fs::path plain = d / "ckpt-20250101-000000-aaaaaa-s000000002.h5";
  const fs::path text = d / "ckpt-20250101-000000-aaaaaa-s000000003.h5";
  hdf5_with_schema(other, "ringtrain-data-1");
  hdf5_with_schema(plain, nullptr);
  std::ofstream(text) << "not HDF5\n";
  for (auto [f, says] : {std::pair{other, "has schema 'ringtrain-data-1': it is not a ringtrain checkpoint"},
                         std::pair{plain, "not a ringtrain checkpoint (it has no 'schema' attribute)"},
                         std::pair{text, "is not a readable HDF5 file"}}) {
    for (const std::string& m : {error_of([&] { read_checkpoint(f.string()); }),
                                 error_of([&] { read_checkpoint_index(f.string()); })}) {
      EXPECT_NE(m.find(f.string()), std::string::npos) << m;
      EXPECT_NE(m.find(says), std::string::npos) << m;
    }
  }
  const std::string m = error_of([&] { find_intact_checkpoint(d.string()); });
  EXPECT_NE(m.find("ringtrain-data-1"), std::string::npos) << m;
  EXPECT_NE(m.find("no 'schema' attribute"), std::string::npos) << m;
  EXPECT_NE(m.find("not a readable HDF5 file"), std::string::npos) << m;
  fs::remove_all(d);
}

// A failed write leaves no temporary file: an injected error, and a real full
// disk (a 256 KiB tmpfs; skipped where mounting is not allowed). Stale temporary
// files of a run are removed by remove_stale_temps, other runs' are left.
TEST(Checkpoint, FailedWritesLeaveNoTemporaryFiles) {
  auto d = temp_dir("cktmp");
  CheckpointData data = sample_data();
  CheckpointDir dir(d.string(), 3);
  std::string m = error_of([&] {
    dir.save("20250101-000000-aaaaaa", 1, data, [](const std::string& name) {
      if (name == "rng") RT_FAIL("injected write error after tensor ", name);
    });
  });
  EXPECT_NE(m.find("injected write error"), std::string::npos) << m;
  EXPECT_EQ(count_files(d, ".tmp."), 0u);
  EXPECT_EQ(count_files(d, ".h5"), 0u);

  std::ofstream(d / "ckpt-20250101-000000-aaaaaa-s000000009.h5.tmp.123") << "partial";
  std::ofstream(d / "ckpt-20250101-000000-bbbbbb-s000000009.h5.tmp.456") << "another run's";
  EXPECT_EQ(dir.remove_stale_temps("20250101-000000-aaaaaa"), 1);
  EXPECT_EQ(count_files(d, ".tmp."), 1u);
  fs::remove_all(d);

  fs::path mnt = temp_dir("ckfull");
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) {
    fs::remove_all(mnt);
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno) << "): full-disk case not run";
  }
  CheckpointData big = sample_data();
  big.tensors.emplace_back("param/big", Tensor::zeros({1 << 18}));  // 1 MiB > 256 KiB
  CheckpointDir full(mnt.string(), 3);
  m = error_of([&] { full.save("20250101-000000-aaaaaa", 1, big); });
  EXPECT_NE(m.find("free"), std::string::npos) << "the message should say how much space is left: " << m;
  EXPECT_EQ(count_files(mnt, ".tmp."), 0u) << "a full disk must not keep the partial file";
  // The disk is usable again: a small checkpoint fits.
  EXPECT_NO_THROW(full.save("20250101-000000-aaaaaa", 2, data));
  ::umount(mnt.c_str());
  fs::remove_all(mnt);
}

// --resume auto matches the run identity: the keys that shape the trajectory
// and the global batch, not the layout, the split of the global batch, the
// checkpoint and log settings or the straggler report's factor.
TEST(Checkpoint, RunIdentityIsTheRunNotItsLayoutOrReporting) {
  TrainConfig a;
  a.data.batch_size = 16;
  TrainConfig b = a;
  b.parallel.pipeline = 2;
  b.parallel.tensor = 2;
  b.parallel.zero = 2;
  b.data.batch_size = 8;
  b.train.accumulation = 2;
  b.checkpoint.every_steps = 7;
  b.log.interval = 3;
  b.comm.straggler_factor = 4;
  EXPECT_EQ(run_state::run_identity(a, 64), run_state::run_identity(b, 64));
  EXPECT_NE(run_state::run_identity(a, 64), run_state::run_identity(a, 128)) << "the global batch";
  TrainConfig c = a;
  c.train.seed += 1;
  EXPECT_NE(run_state::run_identity(a, 64), run_state::run_identity(c, 64)) << "train.seed";
  c = a;
  c.optimizer.lr *= 2;
  EXPECT_NE(run_state::run_identity(a, 64), run_state::run_identity(c, 64)) << "optimizer.lr";
}
