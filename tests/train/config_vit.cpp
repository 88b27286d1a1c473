// The vit configuration keys: defaults, overrides, and errors naming the key.
#include <gtest/gtest.h>

#include "ringtrain/train/config.hpp"
#include "support/error_of.hpp"

using namespace ringtrain;
using test_support::error_of;

TEST(ConfigVit, KeysValidateAndNameThemselves) {
  TrainConfig c;
  c.set("model.name=vit");
  c.set("model.width=96");
  c.set("model.heads=6");
  c.set("model.mlp_ratio=2.5");
  c.set("model.patch=7");
  c.set("model.depth=3");
  c.validate();
  EXPECT_EQ(c.model.heads, 6);
  EXPECT_DOUBLE_EQ(c.model.mlp_ratio, 2.5);
  EXPECT_EQ(c.model.patch, 7);
  EXPECT_NE(c.to_toml().find("heads = 6"), std::string::npos);

  auto bad = [](const char* kv) {
    return error_of([&] {
      TrainConfig t;
      t.set("model.name=vit");
      t.set(kv);
      t.validate();
    });
  };
  EXPECT_NE(bad("model.heads=5").find("model.heads"), std::string::npos);  // 16 % 5
  EXPECT_NE(bad("model.heads=0").find("model.heads"), std::string::npos);
  EXPECT_NE(bad("model.patch=0").find("model.patch"), std::string::npos);
  EXPECT_NE(bad("model.mlp_ratio=-1").find("model.mlp_ratio"), std::string::npos);
  EXPECT_NE(bad("model.depth=0").find("model.depth"), std::string::npos);
  // The same values are fine for the models that ignore them.
  TrainConfig cnn;
  cnn.set("model.heads=5");
  cnn.validate();
}

// model.gelu, model.layernorm_eps (vit and gpt) and optimizer.lr = 0 (imported weights evaluated by training).
TEST(ConfigVit, GeluEpsAndZeroLearningRate) {
  TrainConfig c;
  c.set("model.name=gpt");
  c.set("model.gelu=tanh");
  c.set("model.layernorm_eps=1e-6");
  c.set("optimizer.lr=0");
  c.validate();
  EXPECT_NE(c.to_toml().find("gelu = 'tanh'"), std::string::npos) << c.to_toml();
  auto bad = [](const char* kv) {
    return error_of([&] {
      TrainConfig t;
      t.set("model.name=gpt");
      t.set(kv);
      t.validate();
    });
  };
  const std::string g = bad("model.gelu=sigmoid");
  EXPECT_NE(g.find("model.gelu"), std::string::npos) << g;
  EXPECT_NE(g.find("erf, tanh"), std::string::npos) << g;
  EXPECT_NE(bad("model.layernorm_eps=0").find("model.layernorm_eps"), std::string::npos);
  EXPECT_NE(bad("optimizer.lr=-0.1").find("optimizer.lr"), std::string::npos);
}
