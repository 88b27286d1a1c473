// A [[model.layers]] model in the trainer: a conv net with column/row-split
// convolutions and linears, and a small transformer (residual attention entry
// + transformer entry), trained as data 2, pipeline 2 and tensor 2 at 2 ranks
// (tensor 2 x pipeline 2 and tensor 2 x data 2 at 4), follow the 1-rank run
// of the same TOML within 1e-5 in loss at every step. A shape that the tensor
// size does not divide fails on every rank with the entry, key and size.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "fixtures.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/train/trainer.hpp"
#include "support/error_of.hpp"

using namespace ringtrain;
using test_support::error_of;

namespace {

using test_fixtures::train_losses;

const char* kConv = R"(
[[model.layers]]
type = "conv"
name = "c1"
out = 4
padding = 1
relu = true
pool = 2
tensor = "column"
[[model.layers]]
type = "conv"
name = "c2"
out = 8
padding = 1
relu = true
pool = 2
tensor = "row"
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "linear"
name = "fc1"
out = 16
relu = true
tensor = "column"
[[model.layers]]
type = "linear"
name = "fc2"
tensor = "row"
)";

const char* kVit = R"(
[[model.layers]]
type = "patch_embed"
patch = 7
out = 16
[[model.layers]]
type = "residual"
layers = [{ type = "layernorm" }, { type = "attention", heads = 4 }]
[[model.layers]]
type = "residual"
layers = [{ type = "layernorm" }, { type = "linear", out = 32, tensor = "column" }, { type = "gelu" },
          { type = "linear", out = 16, tensor = "row" }]
[[model.layers]]
type = "transformer"
heads = 4
mlp_ratio = 2.0
[[model.layers]]
type = "layernorm"
[[model.layers]]
type = "token_mean"
[[model.layers]]
type = "linear"
)";

TrainConfig config(const Communicator& world, const std::string& data, const std::string& layers) {
  const auto path = std::filesystem::path(data) / "model.toml";
  if (world.rank() == 0) std::ofstream(path) << "[model]\nname = \"layers\"\n" << layers;
  world.barrier();
  TrainConfig c = test_fixtures::small_config(data);
  c.load_toml(path.string());
  c.validate();
  c.data.batch_size = 16;
  c.train.epochs = 1;
  c.schedule.name = "constant";
  c.optimizer.lr = 0.02;
  return c;
}

void expect_follows(const std::vector<double>& got, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  ASSERT_GT(ref.size(), 4u) << what;
  EXPECT_GT(std::abs(ref.front() - ref.back()), 1e-3) << what << ": the loss should move";
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-5) << what << " step " << i;
}

}  // namespace

TEST(LayersTrainer, FollowsTheOneRankRunInEveryLayout) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (w != 2 && w != 4) GTEST_SKIP() << "layouts of 2 (data, pipeline, tensor) need 2 or 4 ranks";
  const std::string data = test_fixtures::synthetic_mnist_like(world, "layerstrain", 128, 32);
  Communicator self = world.split(world.rank(), 0, "self");
  for (const auto& [name, layers] : {std::pair{"conv", kConv}, std::pair{"vit", kVit}}) {
    const TrainConfig c = config(world, data, layers);
    const std::vector<double> ref = train_losses(c, self);  // 1 rank, batch 16
    if (w == 2) {
      TrainConfig d = c;  // data 2: 8 per rank, the same global batch
      d.data.batch_size = 8;
      expect_follows(train_losses(d, world), ref, std::string(name) + " data 2");
    }
    TrainConfig p = c;
    p.parallel.pipeline = 2;  // at 4 ranks with tensor 2
    p.parallel.tensor = w / 2;
    expect_follows(train_losses(p, world), ref, std::string(name) + (w == 2 ? " pipeline 2" : " pipeline 2 x tensor 2"));
    TrainConfig t = c;  // tensor 2 (x data 2 at 4 ranks: 8 per replica)
    t.parallel.tensor = 2;
    t.data.batch_size = 16 / (w / 2);
    expect_follows(train_losses(t, world), ref, std::string(name) + (w == 2 ? " tensor 2" : " tensor 2 x data 2"));
  }
}

TEST(LayersTrainer, ShapeErrorsOnEveryRank) {
  Communicator world = Communicator::world();
  if (world.size() != 2) GTEST_SKIP() << "tensor 2 at 2 ranks";
  const std::string data = test_fixtures::synthetic_mnist_like(world, "layerserr", 32, 16);
  TrainConfig c = config(world, data, "[[model.layers]]\ntype = \"flatten\"\n[[model.layers]]\ntype = \"linear\"\n"
                                      "name = \"fc1\"\nout = 5\ntensor = \"column\"\n[[model.layers]]\n"
                                      "type = \"linear\"\ntensor = \"row\"\n");
  c.parallel.tensor = 2;
  const std::string e = error_of([&] { train_losses(c, world); });
  EXPECT_NE(e.find("model.layers[1] (linear 'fc1'): key 'out' = 5 is not divisible by parallel.tensor = 2"),
            std::string::npos) << "rank " << world.rank() << ": " << e;
}
