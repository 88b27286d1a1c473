// Cross-check against PyTorch (bench/reference/make_torch_reference.py run by
// /usr/bin/python3): same weights, same batch -> loss, every parameter
// gradient and (resnet) the BN running statistics. PyTorch computes in
// float64, so the comparison measures ringtrain's float32 error. Criterion per
// tensor: ||g - ref||_2 / ||ref||_2 <= 1e-5 (norm-wise relative error).
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "layer_harness.hpp"
#include "ringtrain/nn/loss.hpp"
#include "support/whole_model.hpp"

using namespace ringtrain;
using namespace rt_test;
namespace fs = std::filesystem;

namespace {

std::string script() {
  const char* src = std::getenv("RINGTRAIN_SOURCE_DIR");
  return std::string(src ? src : ".") + "/bench/reference/make_torch_reference.py";
}

template <typename T>
std::vector<T> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.is_open()) << p;
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

void write_file(const fs::path& p, const void* data, std::size_t n) {
  std::ofstream f(p, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

// Norm-wise relative error of a float32 tensor against a float64 reference.
double rel_err(const float* a, const double* ref, std::int64_t n) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

struct Case {
  ModelConfig cfg;
  std::int64_t batch;
  double smoothing;
  std::unique_ptr<Stage> model;
  Tensor x, y;
  fs::path dir;
};

void prepare(Case& k) {
  ModelConfig& c = k.cfg;
  c.seed = 1234;
  k.model = std::make_unique<Stage>(c, Device::cpu());
  Stage& m = *k.model;
  // Random biases too (they start at zero), so their gradients flow through every term.
  for (std::size_t i = 0; i < m.arena().size(); ++i)
    if (m.arena().info(i).name.find("bias") != std::string::npos && m.arena().info(i).name.find("bn") == std::string::npos)
      m.arena().param(i).copy_from(random_tensor(m.arena().info(i).shape, 500 + i, 0.01, 0.1));
  k.x = random_tensor({k.batch, c.in_channels, c.height, c.width}, 77, 0.0, 1.0);
  k.y = Tensor::empty({k.batch}, DType::i64);
  for (std::int64_t i = 0; i < k.batch; ++i) k.y.data<std::int64_t>()[i] = (i * 3 + 1) % c.classes;
  if (c.seq_len > 0) {  // gpt: token ids in, the next tokens as per-token labels
    k.x = Tensor::empty({k.batch, c.seq_len});
    k.y = Tensor::empty({k.batch, c.seq_len}, DType::i64);
    for (std::int64_t i = 0; i < k.batch * c.seq_len; ++i) {
      k.x.data<float>()[i] = float((i * 7 + 3) % c.classes);
      k.y.data<std::int64_t>()[i] = (i * 5 + 2) % c.classes;
    }
  }

  k.dir = fs::temp_directory_path() /
          ("rt_torch_ref_" + c.name + std::to_string(k.batch) + "_" + std::to_string(::getpid()));
  fs::create_directories(k.dir);
  nlohmann::json meta = {{"model", c.name}, {"in_channels", c.in_channels}, {"height", c.height},
                         {"width", c.width}, {"classes", c.classes},        {"depth", c.depth},
                         {"base_width", c.base_width}, {"batch", k.batch}, {"smoothing", k.smoothing},
                         {"heads", c.heads}, {"mlp_ratio", c.mlp_ratio}, {"patch", c.patch},
                         {"seq_len", c.seq_len}};
  std::vector<float> params;
  for (std::size_t i = 0; i < m.arena().size(); ++i) {
    meta["params"].push_back({{"name", m.arena().info(i).name}, {"shape", m.arena().info(i).shape}});
    Tensor p = m.arena().param(i);
    params.insert(params.end(), p.data<float>(), p.data<float>() + p.numel());
  }
  std::ofstream(k.dir / "meta.json") << meta.dump();
  write_file(k.dir / "params.bin", params.data(), params.size() * 4);
  write_file(k.dir / "x.bin", k.x.raw(), k.x.nbytes());
  write_file(k.dir / "labels.bin", k.y.raw(), k.y.nbytes());
}

void verify(Case& k) {
  Stage& m = *k.model;
  m.zero_grads();
  LossResult r = softmax_cross_entropy(m.forward(0, k.x, Mode::train), k.y, k.smoothing);
  test_support::backward(m, r.dlogits);
  double ref_loss = 0;
  std::ifstream(k.dir / "ref_loss.txt") >> ref_loss;
  EXPECT_NEAR(r.loss, ref_loss, 1e-5 * std::fabs(ref_loss)) << "loss";
  auto ref = read_file<double>(k.dir / "ref_grads.bin");
  ASSERT_EQ(static_cast<std::int64_t>(ref.size()), m.arena().numel());
  std::size_t off = 0;
  double worst = 0;
  for (std::size_t i = 0; i < m.arena().size(); ++i) {
    Tensor g = m.arena().grad(i);
    double e = rel_err(g.data<float>(), ref.data() + off, g.numel());
    worst = std::max(worst, e);
    EXPECT_LE(e, 1e-5) << m.arena().info(i).name;
    off += static_cast<std::size_t>(g.numel());
  }
  std::printf("[torch cross-check] %s: loss %.9f vs %.9f, worst gradient rel. error %.2e\n", k.cfg.name.c_str(),
              r.loss, ref_loss, worst);
  auto ref_buf = read_file<double>(k.dir / "ref_buffers.bin");
  off = 0;
  for (auto& b : m.buffers()) {
    ASSERT_LE(off + static_cast<std::size_t>(b.tensor.numel()), ref_buf.size());
    EXPECT_LE(rel_err(b.tensor.data<float>(), ref_buf.data() + off, b.tensor.numel()), 1e-5) << b.name;
    off += static_cast<std::size_t>(b.tensor.numel());
  }
  EXPECT_EQ(off, ref_buf.size());
}

ModelConfig named(const char* n) {
  ModelConfig c;
  c.name = n;
  return c;
}

}  // namespace

// All cases share one Python start-up (importing torch takes seconds).
class TorchCrossCheck : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ModelConfig r = named("resnet");
    r.in_channels = 3;
    r.height = r.width = 16;
    r.depth = 8;
    r.base_width = 8;
    cases_ = new std::vector<Case>();
    cases_->push_back(Case{named("cnn"), 16, 0.0, {}, {}, {}, {}});
    cases_->push_back(Case{named("cnn"), 8, 0.1, {}, {}, {}, {}});
    cases_->push_back(Case{r, 8, 0.0, {}, {}, {}, {}});
    cases_->push_back(Case{named("mlp"), 6, 0.0, {}, {}, {}, {}});
    ModelConfig v = named("vit");  // Fashion-MNIST-sized: 16 tokens of 7x7 patches
    v.depth = 2;
    v.base_width = 16;
    v.heads = 4;
    v.mlp_ratio = 2;
    v.patch = 7;
    cases_->push_back(Case{v, 8, 0.0, {}, {}, {}, {}});
    ModelConfig v3 = named("vit");  // CIFAR-like: 3 channels, 16 tokens of 4x4, odd hidden size
    v3.in_channels = 3;
    v3.height = v3.width = 16;
    v3.depth = 1;
    v3.base_width = 12;
    v3.heads = 3;
    v3.mlp_ratio = 1.5;
    v3.patch = 4;
    cases_->push_back(Case{v3, 4, 0.1, {}, {}, {}, {}});
    ModelConfig g = named("gpt");  // 2 causal blocks, 11-token vocabulary, tied head
    g.seq_len = 8;
    g.classes = 11;
    g.depth = 2;
    g.base_width = 16;
    g.heads = 4;
    g.mlp_ratio = 2;
    cases_->push_back(Case{g, 4, 0.0, {}, {}, {}, {}});
    std::ostringstream cmd;  // (string += in a loop trips GCC 12's -Wrestrict false positive)
    cmd << "/usr/bin/python3 " << script();
    for (auto& k : *cases_) {
      prepare(k);
      cmd << ' ' << k.dir.string();
    }
    const int rc = std::system(cmd.str().c_str());
    status_ = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;  // 77: no torch/numpy in /usr/bin/python3
  }
  static void TearDownTestSuite() {
    if (cases_)
      for (auto& k : *cases_) fs::remove_all(k.dir);
    delete cases_;
    cases_ = nullptr;
  }
  void run(std::size_t i) {
    if (status_ == 77) GTEST_SKIP() << "/usr/bin/python3 has no torch/numpy: PyTorch cross-check skipped";
    ASSERT_EQ(status_, 0) << "reference script " << script() << " failed";
    verify((*cases_)[i]);
  }
  static inline std::vector<Case>* cases_ = nullptr;
  static inline int status_ = -1;
};

TEST_F(TorchCrossCheck, CnnLossAndGradients) { run(0); }
TEST_F(TorchCrossCheck, CnnWithLabelSmoothing) { run(1); }
TEST_F(TorchCrossCheck, ResnetTrainModeWithBatchNormAndRunningStats) { run(2); }
TEST_F(TorchCrossCheck, Mlp) { run(3); }
TEST_F(TorchCrossCheck, VitLossAndGradients) { run(4); }
TEST_F(TorchCrossCheck, VitThreeChannelsWithLabelSmoothing) { run(5); }
TEST_F(TorchCrossCheck, GptCausalTiedLossAndGradients) { run(6); }
