// Optimizer steps against values computed by hand (float64 arenas, so the
// expected decimals hold to ~1e-12; one float32 run checks the float path).
// Each arena has a decay=true parameter "w" and a decay=false parameter "b":
// the b values show that weight decay and trust ratios skip decay=false params.
#include <gtest/gtest.h>

#include <vector>

#include "ringtrain/optim/optimizer.hpp"

using namespace ringtrain;

namespace {

struct Rig {
  ParamArena arena;
  std::unique_ptr<Optimizer> opt;
  Rig(const OptimizerConfig& cfg, std::vector<double> w, std::vector<double> b, DType dt = DType::f64) {
    arena.add("w", {static_cast<std::int64_t>(w.size())}, dt, true);
    arena.add("b", {static_cast<std::int64_t>(b.size())}, dt, false);
    arena.finalize();
    set(arena.param(0), w);
    set(arena.param(1), b);
    opt = make_optimizer(arena, cfg);
  }
  static void set(Tensor t, const std::vector<double>& v) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (t.dtype() == DType::f64) t.data<double>()[i] = v[i];
      else t.data<float>()[i] = static_cast<float>(v[i]);
    }
  }
  void step(double lr, const std::vector<double>& gw, const std::vector<double>& gb) {
    set(arena.grad(0), gw);
    set(arena.grad(1), gb);
    opt->step(lr);
  }
  void expect(std::size_t p, const std::vector<double>& want, double tol = 1e-12) {
    Tensor t = arena.param(p);
    for (std::size_t i = 0; i < want.size(); ++i) {
      double got = t.dtype() == DType::f64 ? t.data<double>()[i] : t.data<float>()[i];
      EXPECT_NEAR(got, want[i], tol * std::max(1.0, std::abs(want[i]))) << arena.info(p).name << "[" << i << "]";
    }
  }
};

OptimizerConfig cfg_of(const char* name) {
  OptimizerConfig c;
  c.name = name;
  return c;
}

}  // namespace

TEST(OptimSteps, SgdMomentumWeightDecay) {
  OptimizerConfig c = cfg_of("sgd");
  c.momentum = 0.9;
  c.weight_decay = 0.1;
  Rig r(c, {1.0, -2.0, 0.5}, {0.5});
  // step 1, lr 0.1, g = [0.5, 0.25, -1]: d = g + 0.1·w = [0.6, 0.05, -0.95]; buf = d
  //   w = w − 0.1·buf = [0.94, -2.005, 0.595].  b (no decay): buf = 0.2, b = 0.5 − 0.02 = 0.48
  r.step(0.1, {0.5, 0.25, -1.0}, {0.2});
  r.expect(0, {0.94, -2.005, 0.595});
  r.expect(1, {0.48});
  // step 2, same g: d = g + 0.1·w = [0.594, 0.0495, -0.9405]
  //   buf = 0.9·[0.6, 0.05, -0.95] + d = [1.134, 0.0945, -1.7955]; w = w − 0.1·buf = [0.8266, -2.01445, 0.77455]
  //   b: buf = 0.9·0.2 + 0.2 = 0.38, b = 0.48 − 0.038 = 0.442
  r.step(0.1, {0.5, 0.25, -1.0}, {0.2});
  r.expect(0, {0.8266, -2.01445, 0.77455});
  r.expect(1, {0.442});
  EXPECT_EQ(r.opt->steps(), 2);
}

TEST(OptimSteps, SgdNesterov) {
  OptimizerConfig c = cfg_of("sgd");
  c.momentum = 0.9;
  c.weight_decay = 0.1;
  c.nesterov = true;
  Rig r(c, {1.0, -2.0, 0.5}, {0.5});
  // step 1: d = [0.6, 0.05, -0.95] = buf; d' = d + 0.9·buf = 1.9·d = [1.14, 0.095, -1.805]
  //   w = [1 − 0.114, −2 − 0.0095, 0.5 + 0.1805] = [0.886, -2.0095, 0.6805]; b: d' = 1.9·0.2, b = 0.5 − 0.038 = 0.462
  r.step(0.1, {0.5, 0.25, -1.0}, {0.2});
  r.expect(0, {0.886, -2.0095, 0.6805});
  r.expect(1, {0.462});
  // step 2: d = g + 0.1·w = [0.5886, 0.04905, -0.93195]; buf = 0.9·buf + d = [1.1286, 0.09405, -1.78695]
  //   d' = d + 0.9·buf = [1.60434, 0.133695, -2.540205]; w = w − 0.1·d' = [0.725566, -2.0228695, 0.9345205]
  //   b: buf = 0.38, d' = 0.2 + 0.342 = 0.542, b = 0.462 − 0.0542 = 0.4078
  r.step(0.1, {0.5, 0.25, -1.0}, {0.2});
  r.expect(0, {0.725566, -2.0228695, 0.9345205});
  r.expect(1, {0.4078});
}

TEST(OptimSteps, SgdFloat32PathAndChangingLr) {
  OptimizerConfig c = cfg_of("sgd");
  c.momentum = 0.5;
  c.dampening = 0.5;
  Rig r(c, {1.0, -1.0}, {2.0}, DType::f32);
  // step 1 (lr 1): buf = g = [0.5, 0.25] (first step ignores dampening, as PyTorch); w = [0.5, -1.25]
  r.step(1.0, {0.5, 0.25}, {1.0});
  r.expect(0, {0.5, -1.25}, 1e-7);
  r.expect(1, {1.0}, 1e-7);
  // step 2 (lr 0.5): buf = 0.5·buf + 0.5·g = [0.5, 0.25]; w = w − 0.5·buf = [0.25, -1.375]; b: buf = 1, b = 0.5
  r.step(0.5, {0.5, 0.25}, {1.0});
  r.expect(0, {0.25, -1.375}, 1e-7);
  r.expect(1, {0.5}, 1e-7);
}

TEST(OptimSteps, AdamBiasCorrectionEpsOutsideSqrt) {
  OptimizerConfig c = cfg_of("adam");  // β = (0.9, 0.999), eps = 1e-8
  Rig r(c, {1.0, -0.5}, {0.0});
  // step 1, lr 0.01, g = [0.1, -0.2]: m = 0.1·g = [0.01, -0.02], v = 0.001·g² = [1e-5, 4e-5]
  //   bc1 = 0.1, bc2 = 0.001: sqrt(v)/sqrt(bc2) = |g| = [0.1, 0.2]; step = (0.01/0.1)·m/(|g| + 1e-8)
  //   w = [1 − 0.001/0.10000001, −0.5 + 0.002/0.20000001] = [0.990000001, -0.4900000005]
  r.step(0.01, {0.1, -0.2}, {0.0});
  r.expect(0, {0.990000001, -0.4900000005});
  r.expect(1, {0.0});  // zero gradient, no decay: unchanged (m = v = 0)
  // step 2, g = [0.3, 0.1]: m = [0.039, -0.008], v = 0.999·v + 0.001·g² = [9.999e-5, 4.996e-5]
  //   bc1 = 0.19, bc2 = 0.001999; denom = sqrt(v/bc2) + 1e-8 = [0.2236515..., 0.1580909...]
  //   w −= (0.01/0.19)·m/denom = [0.0091778..., -0.0026633...] → [0.98082219022, -0.48733663027]
  r.step(0.01, {0.3, 0.1}, {0.0});
  r.expect(0, {0.9808221902205589, -0.4873366302718676});
}

TEST(OptimSteps, AdamCoupledL2VersusAdamWDecoupled) {
  OptimizerConfig c = cfg_of("adam");
  c.weight_decay = 0.1;
  Rig a(c, {1.0, -0.5}, {2.0});
  // Adam L2: step 1 g' = g + 0.1·w = [0.2, -0.25] → update = lr·sign(g')·(1 − ~1e-7): w = [0.9900000005, -0.4900000004]
  a.step(0.01, {0.1, -0.2}, {0.0});
  a.expect(0, {0.9900000005, -0.49000000039999997});
  a.expect(1, {2.0});  // decay=false: g' = 0, unchanged
  // step 2: m = 0.9·[0.02, -0.025] + 0.1·[0.3 + 0.099, 0.1 − 0.049] = [0.0579, -0.0174]
  //   v = 0.999·[4e-5, 6.25e-5] + 0.001·g'² = [1.99161e-4, 6.50385e-5] → w = [0.98034551361, -0.48492288819]
  a.step(0.01, {0.3, 0.1}, {0.0});
  a.expect(0, {0.9803455136142578, -0.48492288818670787});

  c.name = "adamw";
  Rig w(c, {1.0, -0.5}, {2.0});
  // AdamW: w ← w·(1 − 0.01·0.1) = 0.999·w first, then the plain Adam step of the previous test:
  //   step 1: [0.999 − 0.0099999990, −0.4995 + 0.0099999995] = [0.989000001, -0.4895000005]
  w.step(0.01, {0.1, -0.2}, {0.0});
  w.expect(0, {0.989000001, -0.4895000005});
  w.expect(1, {2.0});  // decay=false: no decoupled decay either
  //   step 2: 0.999·w − [0.0091778..., -0.0026633...] = [0.97883319022, -0.48634713027]
  w.step(0.01, {0.3, 0.1}, {0.0});
  w.expect(0, {0.978833190219559, -0.48634713027136756});
}

TEST(OptimSteps, LarsTrustRatioPerTensor) {
  OptimizerConfig c = cfg_of("lars");
  c.momentum = 0.9;
  c.weight_decay = 0.1;
  c.trust_coefficient = 0.01;
  Rig r(c, {3.0, 4.0}, {1.0});
  // step 1, lr 0.5, g = [0.6, 0.8]: ||w|| = 5, ||g|| = 1, λ = 0.01·5/(1 + 0.1·5) = 1/30
  //   v = 0.5·λ·(g + 0.1·w) = (1/60)·[0.9, 1.2] = [0.015, 0.02]; w = [2.985, 3.98]
  //   b (no decay, λ = 1): v = 0.5·0.5 = 0.25, b = 0.75
  r.step(0.5, {0.6, 0.8}, {0.5});
  r.expect(0, {2.985, 3.98});
  r.expect(1, {0.75});
  // step 2: ||w|| = 0.995·5 = 4.975, λ = 0.04975/1.4975 = 0.0332220367..., lr·λ = 0.0166110183...
  //   v = 0.9·[0.015, 0.02] + lr·λ·[0.6 + 0.2985, 0.8 + 0.398] = [0.028425, 0.0379]; w = [2.956575, 3.9421]
  //   b: v = 0.9·0.25 + 0.25 = 0.475, b = 0.275
  r.step(0.5, {0.6, 0.8}, {0.5});
  r.expect(0, {2.956575, 3.9421});
  r.expect(1, {0.275});
}

TEST(OptimSteps, LarsZeroGradientFallsBackToRatioOne) {
  OptimizerConfig c = cfg_of("lars");
  c.weight_decay = 0.1;
  Rig r(c, {3.0, 4.0}, {1.0});
  // ||g|| = 0: λ = 1, so v = lr·wd·w = 0.5·0.1·[3, 4] = [0.15, 0.2]; w = [2.85, 3.8]
  r.step(0.5, {0.0, 0.0}, {0.0});
  r.expect(0, {2.85, 3.8});
  r.expect(1, {1.0});
}

TEST(OptimSteps, LambClippedTrustRatio) {
  OptimizerConfig c = cfg_of("lamb");
  c.eps = 0.0;
  c.weight_decay = 0.01;
  c.max_trust_ratio = 2.0;
  Rig r(c, {3.0, 4.0}, {1.0, -1.0});
  // step 1, lr 0.1, g = [0.6, 0.8]: m̂ = g, v̂ = g², u = g/|g| + 0.01·w = [1.03, 1.04]
  //   r = ||w||/||u|| = 5/1.46373... = 3.4159 → clipped to 2: w = w − 0.1·2·u = [2.794, 3.792]
  //   b (no decay: r = 1, wd = 0), g = [0.5, -0.25]: u = sign(g) = [1, -1] → b = [0.9, -0.9]
  r.step(0.1, {0.6, 0.8}, {0.5, -0.25});
  r.expect(0, {2.794, 3.792});
  r.expect(1, {0.9, -0.9});
  // step 2, g = [-0.3, 0.4]: m = 0.9·[0.06, 0.08] + 0.1·g = [0.024, 0.112]
  //   v = 0.999·[3.6e-4, 6.4e-4] + 0.001·g² = [4.4964e-4, 7.9936e-4]; bc1 = 0.19, bc2 = 0.001999
  //   u = (m/0.19)/sqrt(v/0.001999) + 0.01·w = [0.29427704, 0.97009964]; r = 4.7101/1.0138 = 4.65 → 2
  //   w = [2.794 − 0.2·0.29427704, 3.792 − 0.2·0.97009964] = [2.73514459, 3.59798007]
  //   b, g = [0.5, 0.5]: m = [0.095, 0.0275], v = [4.9975e-4, 3.124375e-4], u = [1, 0.36610353] → [0.8, -0.93661035]
  r.step(0.1, {-0.3, 0.4}, {0.5, 0.5});
  r.expect(0, {2.73514459206792, 3.5979800722377195});
  r.expect(1, {0.8000000000000007, -0.9366103527035843});
}

TEST(OptimSteps, LambUnclippedTrustRatio) {
  OptimizerConfig c = cfg_of("lamb");
  c.eps = 0.0;
  c.weight_decay = 0.01;
  c.max_trust_ratio = 0.0;  // no clip
  Rig r(c, {3.0, 4.0}, {1.0});
  // step 1: u = [1.03, 1.04], r = 5/sqrt(1.03² + 1.04²) = 5/sqrt(2.1425) = 3.41593493
  //   w = [3 − 0.1·r·1.03, 4 − 0.1·r·1.04] = [2.64815870, 3.64474277]
  r.step(0.1, {0.6, 0.8}, {0.5});
  r.expect(0, {2.6481587023721453, 3.644742767443719});
  // step 2: u = [0.29281863, 0.96862707], r = ||w||/||u|| = 4.45214004 → [2.51779175, 3.21349643]
  r.step(0.1, {-0.3, 0.4}, {0.5});
  r.expect(0, {2.517791749175239, 3.213496432906274});
}
