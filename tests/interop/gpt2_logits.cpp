// gpt's logits on imported GPT-2 weights against GPT-2 written directly in
// PyTorch (tests/interop/gpt2_reference.py, float64): the reference writes
// random weights (GPT2Model names, config.json: gelu_new, 1e-5), both compute
// the logits of the same 2 x 32 tokens, and they are compared element by
// element and as next-token distributions (KL divergence per token).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ringtrain/nn/model.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "ringtrain/train/interop.hpp"

using namespace ringtrain;
namespace fs = std::filesystem;

namespace {

fs::path source_dir() {
  if (const char* s = std::getenv("RINGTRAIN_SOURCE_DIR")) return s;
  return fs::path(__FILE__).parent_path().parent_path().parent_path();
}

std::vector<double> read_f64(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<double> v(static_cast<std::size_t>(fs::file_size(p) / 8));
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 8));
  return v;
}

struct Diff {
  double rel = 0, kl = 0;  // max |a - b| / max |b|; mean KL(softmax b || softmax a) per token
};

Diff compare(const float* ours, const std::vector<double>& ref, std::int64_t tokens, std::int64_t vocab) {
  Diff d;
  double scale = 0, worst = 0;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float* a = ours + t * vocab;
    const double* b = ref.data() + t * vocab;
    double ma = -1e300, mb = -1e300;
    for (std::int64_t v = 0; v < vocab; ++v) {
      ma = std::max(ma, double(a[v]));
      mb = std::max(mb, b[v]);
      scale = std::max(scale, std::abs(b[v]));
      worst = std::max(worst, std::abs(double(a[v]) - b[v]));
    }
    double za = 0, zb = 0;
    for (std::int64_t v = 0; v < vocab; ++v) {
      za += std::exp(double(a[v]) - ma);
      zb += std::exp(b[v] - mb);
    }
    for (std::int64_t v = 0; v < vocab; ++v) {
      const double la = double(a[v]) - ma - std::log(za), lb = b[v] - mb - std::log(zb);
      d.kl += std::exp(lb) * (lb - la);
    }
  }
  d.rel = worst / scale;
  d.kl /= double(tokens);
  return d;
}

TEST(Gpt2Logits, ImportedWeightsGiveTheReferenceLogits) {
  if (std::system("/usr/bin/python3 -c 'import torch, h5py' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 with torch and h5py is not available";
  const fs::path dir = fs::temp_directory_path() / ("rt-gpt2-logits-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::int64_t N = 2, T = 32, V = 256, H = 4;
  const std::string ref = "/usr/bin/python3 '" + (source_dir() / "tests/interop/gpt2_reference.py").string() + "' ";
  ASSERT_EQ(std::system((ref + "write '" + (dir / "w").string() + "' 256 32 2 4 32 7").c_str()), 0);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(N * T));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 37 + 11) % V);
  std::ofstream(dir / "tokens", std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
  ASSERT_EQ(std::system((ref + "logits '" + (dir / "w").string() + "' '" + (dir / "tokens").string() + "' 2 32 4 '" +
                         (dir / "logits").string() + "'")
                            .c_str()),
            0);

  ModelConfig mc;
  mc.name = "gpt";
  mc.classes = V;
  mc.seq_len = T;
  mc.base_width = 32;
  mc.depth = 2;
  mc.heads = H;
  mc.gelu = "tanh";  // what the file's config.json says (the trainer sets it from there: interop.hpp)
  Stage m(mc, Device::cpu());
  std::vector<ReadTarget> targets;
  ParamArena& a = m.arena();
  for (std::size_t i = 0; i < a.size(); ++i) {
    Tensor p = a.param(i);
    targets.push_back({"param/" + a.info(i).name, p.flat_view(0, p.numel()), {a.info(i).shape, {}, 0}});
  }
  import_safetensors((dir / "w").string(), "gpt", targets, true);
  Tensor x = Tensor::empty({N, T});
  for (std::size_t i = 0; i < ids.size(); ++i) x.data<float>()[i] = float(ids[i]);
  const Tensor logits = m.forward(0, x, Mode::eval);
  ASSERT_EQ(logits.shape(), (Shape{N, T, V}));

  const Diff tanh = compare(logits.data<float>(), read_f64(dir / "logits.tanh"), N * T, V);
  const Diff erf = compare(logits.data<float>(), read_f64(dir / "logits.erf"), N * T, V);
  // Measured on this machine: max relative 5.0e-7, KL 2.1e-13 per token (float32 against
  // float64); the tolerances are 10x that (the issue asks 1e-5 and 1e-9). The same weights
  // under the erf GELU: 2.5e-4 and 4.2e-8, far outside them.
  std::printf("logits against PyTorch GPT-2 (tanh): max relative %.3g, KL %.3g; against the erf GELU: %.3g, %.3g\n",
              tanh.rel, tanh.kl, erf.rel, erf.kl);
  EXPECT_LE(tanh.rel, 5e-6);
  EXPECT_LE(tanh.kl, 2e-12);
  EXPECT_GT(erf.rel, 5e-6);
  EXPECT_GT(erf.kl, 2e-12);
  fs::remove_all(dir);
}

}  // namespace
