// model.name = "layers": a [[model.layers]] TOML list. A description of the
// built-in `cnn` and `vit` gives bitwise the same parameters and forward
// output as the built-in model; a model with every layer kind is gradient-checked
// against central differences; --print-config output reads back to the same
// list; bad entries give errors naming the index, the key and the shape.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "ringtrain/train/config.hpp"
#include "support/error_of.hpp"
#include "support/whole_model.hpp"

using namespace ringtrain;
using test_support::error_of;
using test_support::layer_names;

namespace {

TrainConfig parse(const std::string& model_toml) {
  static int n = 0;
  const auto path = std::filesystem::temp_directory_path() / ("rt_layers_" + std::to_string(::getpid()) + "_" +
                                                              std::to_string(n++) + ".toml");
  std::ofstream(path) << model_toml;
  TrainConfig c;
  c.load_toml(path.string());
  std::filesystem::remove(path);
  return c;
}

ModelConfig model_of(const TrainConfig& t, std::int64_t ch = 1, std::int64_t hw = 28) {
  ModelConfig m;
  m.name = t.model.name;
  m.layers = t.model.layers;
  m.in_channels = ch;
  m.height = m.width = hw;
  return m;
}

Tensor random_images(const Shape& s, std::uint64_t seed) {
  Tensor t = Tensor::empty(s);
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0, 1);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(g);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data<float>(), b.data<float>(), a.numel() * sizeof(float)) == 0;
}

// Same parameter names, shapes and bits, and the same forward output bit for bit.
void expect_identical(Stage& a, Stage& b, const Shape& input) {
  ASSERT_EQ(a.arena().size(), b.arena().size());
  for (std::size_t i = 0; i < a.arena().size(); ++i) {
    EXPECT_EQ(a.arena().info(i).name, b.arena().info(i).name);
    EXPECT_TRUE(same_bits(a.arena().param(i), b.arena().param(i))) << a.arena().info(i).name;
  }
  const Tensor x = random_images(input, 7);
  for (Mode mode : {Mode::train, Mode::eval})
    EXPECT_TRUE(same_bits(a.forward(0, x, mode), b.forward(0, x, mode))) << (mode == Mode::train ? "train" : "eval");
}

const char* kCnn = R"(
[model]
name = "layers"
[[model.layers]]
type = "conv"
name = "conv1"
out = 32
padding = 1
relu = true
pool = 2
[[model.layers]]
type = "conv"
name = "conv2"
out = 64
padding = 1
relu = true
pool = 2
[[model.layers]]
type = "flatten"
name = "flatten"
[[model.layers]]
type = "linear"
name = "fc1"
out = 128
relu = true
[[model.layers]]
type = "dropout"
name = "dropout"
p = 0.25
[[model.layers]]
type = "linear"
name = "fc2"
)";

}  // namespace

TEST(LayersModel, CnnDescriptionIsTheBuiltInCnnBitForBit) {
  TrainConfig t = parse(kCnn);
  ModelConfig builtin = model_of(t);
  builtin.name = "cnn";
  builtin.dropout = 0.25;
  Stage a(model_of(t), Device::cpu()), b(builtin, Device::cpu());
  EXPECT_EQ(a.arena().numel(), b.arena().numel());
  expect_identical(a, b, {4, 1, 28, 28});
}

TEST(LayersModel, VitDescriptionIsTheBuiltInVitBitForBit) {
  std::string s = "[model]\nname = \"layers\"\n[[model.layers]]\ntype = \"patch_embed\"\nname = \"patch_embed\"\n"
                  "patch = 7\nout = 16\n";
  for (int i = 0; i < 2; ++i)
    s += cat("[[model.layers]]\ntype = \"transformer\"\nname = \"blocks.", i, "\"\nheads = 4\nmlp_ratio = 2\n");
  s += "[[model.layers]]\ntype = \"layernorm\"\nname = \"norm\"\n[[model.layers]]\ntype = \"token_mean\"\n"
       "name = \"pool\"\n[[model.layers]]\ntype = \"linear\"\nname = \"head\"\n";
  TrainConfig t = parse(s);
  ModelConfig v = model_of(t);
  v.name = "vit";
  v.base_width = 16, v.heads = 4, v.depth = 2, v.mlp_ratio = 2.0, v.patch = 7;
  Stage a(model_of(t), Device::cpu()), b(v, Device::cpu());
  EXPECT_EQ(layer_names(a), layer_names(b));
  expect_identical(a, b, {3, 1, 28, 28});
}

TEST(LayersModel, GptDescriptionIsTheBuiltInGptBitForBit) {
  std::string s = "[model]\nname = \"layers\"\n[[model.layers]]\ntype = \"embedding\"\nname = \"wte\"\nout = 16\n"
                  "[[model.layers]]\ntype = \"dropout\"\nname = \"drop\"\np = 0.1\n";
  for (int i = 0; i < 2; ++i)
    s += cat("[[model.layers]]\ntype = \"transformer\"\nname = \"blocks.", i,
             "\"\nheads = 4\nmlp_ratio = 2\ndropout = 0.1\ncausal = true\n");
  s += "[[model.layers]]\ntype = \"layernorm\"\nname = \"norm\"\n[[model.layers]]\ntype = \"lm_head\"\n"
       "name = \"lm_head\"\ntie = \"wte\"\n";
  TrainConfig t = parse(s);
  ModelConfig l = model_of(t);
  l.seq_len = 8, l.classes = 11;
  ModelConfig g = l;
  g.name = "gpt";
  g.base_width = 16, g.heads = 4, g.depth = 2, g.mlp_ratio = 2.0, g.dropout = 0.1;
  Stage a(l, Device::cpu()), b(g, Device::cpu());
  EXPECT_EQ(layer_names(a), layer_names(b));
  ASSERT_EQ(a.arena().size(), b.arena().size());
  for (std::size_t i = 0; i < a.arena().size(); ++i) {
    EXPECT_EQ(a.arena().info(i).name, b.arena().info(i).name);
    EXPECT_TRUE(same_bits(a.arena().param(i), b.arena().param(i))) << a.arena().info(i).name;
  }
  Tensor x = Tensor::empty({3, 8});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float((i * 7 + 1) % 11);
  for (Mode mode : {Mode::train, Mode::eval})  // train: the same dropout masks too
    EXPECT_TRUE(same_bits(a.forward(0, x, mode), b.forward(0, x, mode))) << (mode == Mode::train ? "train" : "eval");
  // Without a tie target the lm_head entry is refused, naming the entry and the key.
  const std::string bad = error_of([&] {
    TrainConfig u = parse("[model]\nname = \"layers\"\n[[model.layers]]\ntype = \"embedding\"\nname = \"e\"\n"
                          "out = 16\n[[model.layers]]\ntype = \"lm_head\"\ntie = \"wte\"\n");
    ModelConfig m = model_of(u);
    m.seq_len = 8, m.classes = 11;
    Stage st(m, Device::cpu());
  });
  EXPECT_NE(bad.find("model.layers[1] (lm_head 'lm_head1'): key 'tie' = 'wte' names no embedding entry"),
            std::string::npos) << bad;
}

// Every layer kind in one small model: d loss / d parameter by central
// differences (float64 sums over a float32 model) against backward.
TEST(LayersModel, EveryKindGradientChecked) {
  TrainConfig t = parse(R"(
[model]
name = "layers"
[[model.layers]]
type = "conv"
out = 4
padding = 1
[[model.layers]]
type = "batchnorm"
[[model.layers]]
type = "gelu"
[[model.layers]]
type = "maxpool"
kernel = 3
stride = 1
padding = 1
[[model.layers]]
type = "residual"
relu = true
layers = [{ type = "conv", out = 6, stride = 2, padding = 1 }, { type = "batchnorm" }]
shortcut = [{ type = "conv", out = 6, kernel = 1, stride = 2 }]
[[model.layers]]
type = "avgpool"
kernel = 2
[[model.layers]]
type = "patch_embed"
patch = 1
out = 8
[[model.layers]]
type = "residual"
layers = [{ type = "layernorm" }, { type = "attention", heads = 2 }]
[[model.layers]]
type = "transformer"
heads = 2
mlp_ratio = 1.5
[[model.layers]]
type = "token_mean"
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "linear"
out = 12
[[model.layers]]
type = "relu"
[[model.layers]]
type = "linear"
)");
  ModelConfig mc = model_of(t, 2, 8);
  mc.classes = 3;
  Stage m(mc, Device::cpu());
  const Tensor x = random_images({2, 2, 8, 8}, 3);
  Tensor labels = Tensor::empty({2}, DType::i32);
  labels.data<std::int32_t>()[0] = 1, labels.data<std::int32_t>()[1] = 2;
  auto loss = [&] { return softmax_cross_entropy_loss(m.forward(0, x, Mode::train), labels); };
  m.zero_grads();
  test_support::backward(m, softmax_cross_entropy(m.forward(0, x, Mode::train), labels).dlogits);
  std::mt19937_64 g(5);
  int checked = 0;
  for (std::size_t i = 0; i < m.arena().size(); ++i) {
    Tensor p = m.arena().param(i), dp = m.arena().grad(i);
    for (int k = 0; k < 2; ++k, ++checked) {
      const std::int64_t j = std::int64_t(g() % std::uint64_t(p.numel()));
      float& w = p.data<float>()[j];
      const float w0 = w;
      w = w0 + 3e-3f;
      const double up = loss(), hu = double(w) - double(w0);
      w = w0 - 3e-3f;
      const double down = loss(), hd = double(w0) - double(w);
      w = w0;
      const double fd = (up - down) / (hu + hd), an = dp.data<float>()[j];
      EXPECT_NEAR(an, fd, 2e-3 + 2e-2 * std::abs(fd)) << m.arena().info(i).name << "[" << j << "]";
    }
  }
  EXPECT_GT(checked, 40);
}

TEST(LayersModel, PrintConfigReadsBackToTheSameList) {
  TrainConfig t = parse(R"(
[model]
name = "layers"
[[model.layers]]
type = "conv"
out = 8
padding = 1
tensor = "column"
[[model.layers]]
type = "residual"
layers = [{ type = "relu" }, { type = "dropout", p = 0.5 }]
[[model.layers]]
type = "conv"
out = 8
tensor = "row"
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "linear"
)");
  const std::string text = t.to_toml();
  EXPECT_NE(text.find("[[model.layers]]"), std::string::npos);
  TrainConfig back = parse(text);
  EXPECT_EQ(back.model.layers, t.model.layers);
  EXPECT_EQ(back.to_toml(), text);
  back.validate();
  EXPECT_EQ(TrainConfig().to_toml().find("model.layers"), std::string::npos);  // other models: unchanged text
  bool listed = false;  // --list-keys
  for (const auto& k : TrainConfig::keys()) listed |= k.rfind("model.layers ", 0) == 0;
  EXPECT_TRUE(listed);
}

TEST(LayersModel, ErrorsNameTheEntryTheKeyAndTheShape) {
  auto build_err = [](const std::string& layers) {
    return error_of([&] {
      TrainConfig t = parse("[model]\nname = \"layers\"\n" + layers);
      t.validate();
      build_model_layers(model_of(t));
    });
  };
  const std::string flat = "[[model.layers]]\ntype = \"flatten\"\n";
  const std::string head = "[[model.layers]]\ntype = \"linear\"\n";
  // A linear on images: names the entry and the [C, H, W] shape.
  std::string e = build_err("[[model.layers]]\ntype = \"linear\"\nout = 5\n" + flat + head);
  EXPECT_NE(e.find("model.layers[0] (linear 'linear0')"), std::string::npos) << e;
  EXPECT_NE(e.find("[1, 28, 28]"), std::string::npos) << e;
  EXPECT_NE(e.find("flatten"), std::string::npos) << e;
  // Unknown key and type, wrong value type: index and key.
  e = build_err("[[model.layers]]\ntype = \"conv\"\nout = 4\nkernal = 3\n" + flat + head);
  EXPECT_NE(e.find("model.layers[0] (conv): unknown key 'kernal'"), std::string::npos) << e;
  e = build_err(flat + "[[model.layers]]\ntype = \"dense\"\n");
  EXPECT_NE(e.find("model.layers[1]: unknown type 'dense'"), std::string::npos) << e;
  e = build_err("[[model.layers]]\ntype = \"conv\"\nout = \"4\"\n");
  EXPECT_NE(e.find("model.layers[0] (conv): key 'out' must be an integer"), std::string::npos) << e;
  e = build_err("[[model.layers]]\ntype = \"conv\"\nkernel = 3\n");
  EXPECT_NE(e.find("key 'out' (output channels) is required"), std::string::npos) << e;
  // Nested entries: the path into the block.
  e = build_err("[[model.layers]]\ntype = \"residual\"\nlayers = [{ type = \"conv\", out = 4, stride = 2 }]\n" + flat +
                head);
  EXPECT_NE(e.find("model.layers[0] (residual 'residual0'): its layers give [4, 13, 13] but the identity shortcut "
                   "gives its input [1, 28, 28]"), std::string::npos) << e;
  e = build_err("[[model.layers]]\ntype = \"residual\"\nlayers = [{ type = \"dropout\", p = 1.5 }]\n");
  EXPECT_NE(e.find("model.layers[0].layers[0] (dropout): key 'p' must be in [0, 1)"), std::string::npos) << e;
  // Kernel larger than the input; patch that does not divide; heads that do not divide the width.
  e = build_err("[[model.layers]]\ntype = \"conv\"\nout = 4\nkernel = 30\n" + flat + head);
  EXPECT_NE(e.find("model.layers[0] (conv 'conv0'): input [1, 28, 28]"), std::string::npos) << e;
  e = build_err("[[model.layers]]\ntype = \"patch_embed\"\npatch = 5\nout = 8\n");
  EXPECT_NE(e.find("model.layers[0] (patch_embed 'patch_embed0'): key 'patch' = 5 does not divide its input "
                   "[1, 28, 28]"), std::string::npos) << e;
  e = build_err("[[model.layers]]\ntype = \"patch_embed\"\npatch = 4\nout = 10\n[[model.layers]]\n"
                "type = \"attention\"\nheads = 4\n");
  EXPECT_NE(e.find("model.layers[1] (attention 'attention1'): key 'heads' = 4 does not divide the token width 10 of "
                   "its input [49, 10]"), std::string::npos) << e;
  // Column without row; row without column; the last output is not one score per class.
  e = build_err(flat + "[[model.layers]]\ntype = \"linear\"\nout = 8\ntensor = \"column\"\n");
  EXPECT_NE(e.find("model.layers[1] (linear 'linear1') splits its output"), std::string::npos) << e;
  e = build_err(flat + "[[model.layers]]\ntype = \"linear\"\ntensor = \"row\"\n");
  EXPECT_NE(e.find("model.layers[1] (linear 'linear1'): tensor = \"row\" needs an input split"), std::string::npos)
      << e;
  e = build_err(flat + "[[model.layers]]\ntype = \"linear\"\nout = 7\n");
  EXPECT_NE(e.find("the last entry's output is [7], but the loss needs [10]"), std::string::npos) << e;
  e = build_err(flat + "[[model.layers]]\ntype = \"linear\"\nname = \"x\"\n[[model.layers]]\ntype = \"linear\"\n"
                "name = \"x\"\n");
  EXPECT_NE(e.find("model.layers[2]: name 'x' is already used by model.layers[1]"), std::string::npos) << e;
  // Config-level: the list without the name, the name without the list, --set.
  e = error_of([] { parse("[model]\nname = \"layers\"\n").validate(); });
  EXPECT_NE(e.find("needs a [[model.layers]] list"), std::string::npos) << e;
  e = error_of([&] { parse("[model]\nname = \"cnn\"\n" + flat).validate(); });
  EXPECT_NE(e.find("model.name = 'cnn' does not use it"), std::string::npos) << e;
  e = error_of([] { TrainConfig().set("model.layers=[]"); });
  EXPECT_NE(e.find("give it as [[model.layers]] in the TOML file"), std::string::npos) << e;
  e = error_of([] { parse("[model]\nname = \"layers\"\nlayers = [1]\n"); });
  EXPECT_NE(e.find("model.layers[0] must be a table"), std::string::npos) << e;
}

TEST(LayersModel, ColumnRowMarksAtTensorOneBuildPlainLayers) {
  // At tensor = 1 the column/row marks build plain layers: the same model as without them.
  TrainConfig marked = parse(R"(
[model]
name = "layers"
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "linear"
name = "fc1"
out = 12
relu = true
tensor = "column"
[[model.layers]]
type = "linear"
name = "fc2"
tensor = "row"
)");
  TrainConfig plain = marked;
  for (auto& d : plain.model.layers) std::erase_if(d.options, [](const auto& kv) { return kv.first == "tensor"; });
  Stage a(model_of(marked), Device::cpu()), b(model_of(plain), Device::cpu());
  expect_identical(a, b, {2, 1, 28, 28});
}

// The job files of examples/layers_toml/README.md: they load, validate and
// build with the parameter counts stated there, and the examples' copies are
// the jobs' files.
TEST(LayersModel, JobFilesBuildWithTheirStatedSizes) {
  const char* src = std::getenv("RINGTRAIN_SOURCE_DIR");
  if (!src) GTEST_SKIP() << "RINGTRAIN_SOURCE_DIR not set (ctest sets it)";
  const std::filesystem::path root(src);
  for (const auto& [file, params] : {std::pair{"layers_lenet5.toml", 61706}, std::pair{"layers_vgg.toml", 218538},
                                     std::pair{"layers_vit.toml", 60634}}) {
    TrainConfig t;
    t.load_toml((root / "jobs" / file).string());
    t.validate();
    EXPECT_EQ(Stage(model_of(t), Device::cpu()).arena().numel(), params) << file;
    std::ifstream a(root / "jobs" / file), b(root / "examples" / "layers_toml" / file);
    const std::string ta{std::istreambuf_iterator<char>(a), {}}, tb{std::istreambuf_iterator<char>(b), {}};
    EXPECT_EQ(ta, tb) << file << ": examples/layers_toml/ and jobs/ differ";
  }
}
