// register_model: a registered model is built like a built-in one (a copy of
// the built-in mlp gives its exact parameters and output), planned without
// allocating (counts against a formula), accepted by the configuration, and
// every misuse is an Error naming the model and what is wrong.
#include <gtest/gtest.h>

#include <cstring>

#include "nn/layer_harness.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/nn/model_registry.hpp"
#include "ringtrain/train/config.hpp"
#include "support/error_of.hpp"
#include "support/whole_model.hpp"

using namespace ringtrain;
using ringtrain::test_support::error_of;

namespace {

ModelConfig config(const std::string& name) {
  ModelConfig m;
  m.name = name;
  m.in_channels = 1;
  m.height = m.width = 28;
  m.classes = 10;
  m.seed = 7;
  return m;
}

// The built-in mlp written as a user would (models.cpp is the independent reference).
std::vector<LayerPtr> mlp_copy(const ModelConfig& c) {
  std::vector<LayerPtr> L;
  L.push_back(std::make_unique<Flatten>("flatten"));
  L.push_back(std::make_unique<Linear>("fc1", LinearSpec{c.in_channels * c.height * c.width, 256, true, true},
                                       Init::kaiming_normal));
  L.push_back(std::make_unique<Linear>("fc2", LinearSpec{256, 128, true, true}, Init::kaiming_normal));
  L.push_back(std::make_unique<Linear>("fc3", LinearSpec{128, c.classes, true, false}, Init::xavier_uniform));
  return L;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Registered once per process (the registry refuses a second registration).
const bool registered = [] {
  register_model("mlp_copy", mlp_copy);
  register_model("throws", [](const ModelConfig& c) -> std::vector<LayerPtr> {
    RT_FAIL("model.width = ", c.base_width, " is too small for this net");
  });
  register_model("empty", [](const ModelConfig&) { return std::vector<LayerPtr>{}; });
  register_model("twins", [](const ModelConfig&) {
    std::vector<LayerPtr> L;
    L.push_back(std::make_unique<Flatten>("same"));
    L.push_back(std::make_unique<Flatten>("same"));
    return L;
  });
  return true;
}();

}  // namespace

TEST(ModelRegistry, RegisteredCopyOfMlpMatchesBuiltinBitForBit) {
  ASSERT_TRUE(registered);
  Stage mine(config("mlp_copy"), Device::cpu());
  Stage builtin(config("mlp"), Device::cpu());
  ASSERT_EQ(test_support::layer_names(mine), test_support::layer_names(builtin));
  ASSERT_EQ(mine.arena().size(), builtin.arena().size());
  for (std::size_t i = 0; i < mine.arena().size(); ++i)
    EXPECT_TRUE(same_bytes(mine.arena().param(i), builtin.arena().param(i))) << "parameter " << i;
  Tensor x = rt_test::random_tensor({4, 1, 28, 28}, 3);
  EXPECT_TRUE(same_bytes(mine.forward(0, x, Mode::eval), builtin.forward(0, x, Mode::eval)));
}

TEST(ModelRegistry, PlanCountsParametersWithoutBuilding) {
  const auto plan = plan_model_layers(config("mlp_copy"));
  ASSERT_EQ(plan.size(), 4u);
  const std::int64_t expect[] = {0, 784 * 256 + 256, 256 * 128 + 128, 128 * 10 + 10};
  for (std::size_t i = 0; i < plan.size(); ++i) {
    EXPECT_EQ(plan[i].numel, expect[i]) << plan[i].name;
    EXPECT_EQ(plan[i].params, i == 0 ? 0u : 2u) << plan[i].name;
  }
  EXPECT_EQ(build_model_layers(config("mlp_copy")).size(), 4u);
  EXPECT_GT(model_flops_per_sample(config("mlp_copy")), 3.0 * 2 * 784 * 256);
}

TEST(ModelRegistry, ConfigurationAcceptsRegisteredNamesAndListsThemOtherwise) {
  TrainConfig c;
  c.set("model.name=mlp_copy");
  EXPECT_NO_THROW(c.validate());
  c.set("model.name=mlp_cpy");
  const std::string e = error_of([&] { c.validate(); });
  EXPECT_NE(e.find("model.name"), std::string::npos) << e;
  EXPECT_NE(e.find("'mlp_cpy'"), std::string::npos) << e;
  EXPECT_NE(e.find("mlp, cnn, resnet, vit"), std::string::npos) << e;
  EXPECT_NE(e.find("mlp_copy"), std::string::npos) << "the registered names are listed: " << e;
  const std::string b = error_of([] { build_model_layers(config("nonesuch")); });
  EXPECT_NE(b.find("unknown model 'nonesuch'"), std::string::npos) << b;
  EXPECT_NE(b.find("mlp_copy"), std::string::npos) << b;
  EXPECT_TRUE(is_known_model("mlp_copy"));
  EXPECT_TRUE(is_known_model("resnet"));
  EXPECT_FALSE(is_known_model("nonesuch"));
  const auto names = registered_model_names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_NE(std::find(names.begin(), names.end(), "mlp_copy"), names.end());
}

TEST(ModelRegistry, MisuseIsRefusedWithTheName) {
  std::string e = error_of([] { register_model("cnn", mlp_copy); });
  EXPECT_NE(e.find("'cnn' is a built-in model"), std::string::npos) << e;
  e = error_of([] { register_model("mlp_copy", mlp_copy); });
  EXPECT_NE(e.find("already registered"), std::string::npos) << e;
  e = error_of([] { register_model("", mlp_copy); });
  EXPECT_NE(e.find("name is empty"), std::string::npos) << e;
  e = error_of([] { register_model("no_builder", nullptr); });
  EXPECT_NE(e.find("'no_builder'"), std::string::npos) << e;
  EXPECT_FALSE(is_registered_model("no_builder"));
}

TEST(ModelRegistry, BuilderErrorsNameTheModel) {
  std::string e = error_of([] { build_model_layers(config("throws")); });
  EXPECT_NE(e.find("model 'throws': model.width = 16 is too small"), std::string::npos) << e;
  e = error_of([] { build_model_layers(config("empty")); });
  EXPECT_NE(e.find("model 'empty': the registered builder returned no layers"), std::string::npos) << e;
  e = error_of([] { plan_model_layers(config("twins")); });
  EXPECT_NE(e.find("both named 'same'"), std::string::npos) << e;
}
