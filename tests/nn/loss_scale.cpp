// Dynamic loss scaling: the policy against a hand-written trace (backoff on
// overflow, growth after `interval` good steps, clamping at min/max), the
// checkpoint round trip, bad configurations, and the unscale step it pairs with
// (unscale_grads: exact for a power-of-two scale, false on inf/NaN).
#include <gtest/gtest.h>

#include <limits>

#include "ringtrain/core/error.hpp"
#include "ringtrain/optim/grad_utils.hpp"
#include "ringtrain/optim/loss_scale.hpp"

using namespace ringtrain;

TEST(LossScaler, BacksOffGrowsAndClamps) {
  LossScaleConfig c;
  c.init_scale = 1024;
  c.interval = 3;
  c.min_scale = 256;
  c.max_scale = 2048;
  LossScaler s(c);
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f / 1024);
  // (finite?, scale after): overflow halves; 3 good steps double; clamps at both ends.
  const std::pair<bool, float> trace[] = {{false, 512},  {true, 512},  {true, 512},  {true, 1024}, {false, 512},
                                          {false, 256},  {false, 256}, {true, 256},  {true, 256},  {true, 512},
                                          {true, 512},   {true, 512},  {true, 1024}, {true, 1024}, {true, 1024},
                                          {true, 2048},  {true, 2048}, {true, 2048}, {true, 2048}};
  int skipped = 0;
  for (auto [finite, want] : trace) {
    EXPECT_EQ(s.update(finite), finite);
    skipped += !finite;
    EXPECT_EQ(s.scale(), want);
    EXPECT_EQ(s.inv_scale(), 1.0f / want);
  }
  EXPECT_EQ(s.state().skipped, skipped);
  EXPECT_EQ(s.state().steps, static_cast<long long>(std::size(trace)));
}

TEST(LossScaler, SaveLoadRoundTripAndBadInput) {
  LossScaleConfig c;
  c.interval = 5;
  LossScaler a(c), b(c);
  for (bool f : {true, false, true, true}) a.update(f);
  double st[4];
  a.save(st);
  b.load(st);
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.state().good_steps, a.state().good_steps);
  EXPECT_EQ(b.state().skipped, 1);
  // Both continue identically.
  for (bool f : {true, true, true, false, true}) EXPECT_EQ(a.update(f), b.update(f));
  EXPECT_EQ(a.scale(), b.scale());

  double bad[4] = {-1, 0, 0, 0};
  EXPECT_THROW(b.load(bad), Error);
  LossScaleConfig g;
  g.backoff = 1.5f;
  try {
    LossScaler x(g);
    FAIL() << "backoff 1.5 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backoff 1.5"), std::string::npos) << e.what();
  }
  g = LossScaleConfig{};
  g.init_scale = 1e9f;  // above max_scale
  EXPECT_THROW(LossScaler{g}, Error);
}

TEST(LossScaler, UnscaleIsExactForPowersOfTwoAndFlagsOverflow) {
  ParamArena a;
  a.add("w", {3, 5}, DType::f32, true);
  a.add("w64", {4}, DType::f64, true);
  a.finalize();
  for (std::int64_t i = 0; i < 15; ++i) a.grad(0).data<float>()[i] = 0.001f * static_cast<float>(i - 7) * 65536.0f;
  for (std::int64_t i = 0; i < 4; ++i) a.grad(1).data<double>()[i] = 3.0 * 65536.0;
  EXPECT_TRUE(unscale_grads(a, 1.0 / 65536));
  for (std::int64_t i = 0; i < 15; ++i) EXPECT_EQ(a.grad(0).data<float>()[i], 0.001f * static_cast<float>(i - 7));
  for (std::int64_t i = 0; i < 4; ++i) EXPECT_EQ(a.grad(1).data<double>()[i], 3.0);
  a.grad(1).data<double>()[2] = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(unscale_grads(a, 0.5));
  a.grad(1).data<double>()[2] = 0;
  a.grad(0).data<float>()[4] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(unscale_grads(a, 0.5));
}
