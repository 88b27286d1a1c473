// Optimizer state and plumbing: state save/restore is bitwise (same object and
// a fresh one), decay=false parameters get no weight decay, results do not
// depend on the thread count, float16/bfloat16 parameters use float32 state,
// gradient unscaling/clipping, and errors for bad configurations.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ringtrain/optim/grad_utils.hpp"
#include "ringtrain/optim/optimizer.hpp"
#include "ringtrain/optim/update_math.hpp"

using namespace ringtrain;

namespace {

const char* kAll[] = {"sgd", "adam", "adamw", "lars", "lamb"};

OptimizerConfig config_for(const std::string& name) {
  OptimizerConfig c;
  c.name = name;
  c.momentum = 0.9;
  c.weight_decay = 0.01;
  c.trust_coefficient = 0.02;
  if (name == "sgd") c.nesterov = true;
  return c;
}

// A mixed arena: a big float32 tensor (takes the OpenMP path), a float32 bias
// (decay=false) and a float64 tensor.
void build(ParamArena& a) {
  a.add("big", {400, 250}, DType::f32, true);
  a.add("bias", {250}, DType::f32, false);
  a.add("w64", {7, 3}, DType::f64, true);
  a.finalize();
}

// Deterministic values in [-1, 1) from (seed, index).
double hash_value(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t x = (seed * 0x9E3779B97F4A7C15ull) ^ (i + 0x632BE59BD9B4E019ull);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

void fill(Tensor t, std::uint64_t seed, double scale = 1.0) {
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      T* d = t.data<T>();
      for (std::int64_t i = 0; i < t.numel(); ++i) d[i] = static_cast<T>(scale * hash_value(seed, i));
    }
  });
}

void fill_params(ParamArena& a, std::uint64_t seed) {
  for (std::size_t i = 0; i < a.size(); ++i) fill(a.param(i), seed * 31 + i);
}
void fill_grads(ParamArena& a, std::uint64_t seed) {
  for (std::size_t i = 0; i < a.size(); ++i) fill(a.grad(i), seed * 131 + i + 7, 0.1);
}

bool same_bytes(const Tensor& x, const Tensor& y) {
  return x.nbytes() == y.nbytes() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

std::vector<Tensor> snapshot_params(const ParamArena& a) {
  std::vector<Tensor> out;
  for (DType dt : a.dtypes()) out.push_back(a.params_flat(dt).clone());
  return out;
}

void run_steps(ParamArena& a, Optimizer& opt, int first, int n) {
  for (int s = first; s < first + n; ++s) {
    fill_grads(a, static_cast<std::uint64_t>(s));
    opt.step(0.05 * (1.0 - 0.05 * s));
  }
}

}  // namespace

class OptimStateRoundTrip : public ::testing::TestWithParam<const char*> {};

TEST_P(OptimStateRoundTrip, RestoreThenStepIsBitwiseIdentical) {
  const std::string name = GetParam();
  ParamArena a;
  build(a);
  fill_params(a, 1);
  auto opt = make_optimizer(a, config_for(name));
  run_steps(a, *opt, 0, 3);

  // Save: parameters and optimizer state (deep copies).
  std::vector<Tensor> p_saved = snapshot_params(a);
  Optimizer::NamedTensors saved;
  for (const auto& [k, t] : opt->state()) saved.emplace_back(k, t.clone());
  EXPECT_EQ(saved.back().first, "step");
  EXPECT_EQ(saved.back().second.data<std::int64_t>()[0], 3);

  run_steps(a, *opt, 3, 3);
  std::vector<Tensor> p_after = snapshot_params(a);
  Optimizer::NamedTensors s_after;
  for (const auto& [k, t] : opt->state()) s_after.emplace_back(k, t.clone());
  // The state really moved, so restoring is meaningful.
  for (std::size_t k = 0; k < saved.size(); ++k) EXPECT_FALSE(same_bytes(saved[k].second, s_after[k].second)) << saved[k].first;

  auto restore_and_check = [&](Optimizer& o, const char* what) {
    const auto dts = a.dtypes();
    for (std::size_t d = 0; d < dts.size(); ++d) a.params_flat(dts[d]).copy_from(p_saved[d]);
    o.load_state(saved);
    EXPECT_EQ(o.steps(), 3) << what;
    run_steps(a, o, 3, 3);
    for (std::size_t d = 0; d < dts.size(); ++d)
      EXPECT_TRUE(same_bytes(a.params_flat(dts[d]), p_after[d])) << what << ": " << dtype_name(dts[d]) << " params";
    const auto st = o.state();
    ASSERT_EQ(st.size(), s_after.size());
    for (std::size_t k = 0; k < st.size(); ++k) {
      EXPECT_EQ(st[k].first, s_after[k].first);
      EXPECT_TRUE(same_bytes(st[k].second, s_after[k].second)) << what << ": state " << st[k].first;
    }
  };
  restore_and_check(*opt, "same optimizer");
  auto fresh = make_optimizer(a, config_for(name));  // as after loading a checkpoint
  restore_and_check(*fresh, "fresh optimizer");
}

INSTANTIATE_TEST_SUITE_P(All, OptimStateRoundTrip, ::testing::ValuesIn(kAll));

TEST(OptimState, NamesLayoutAndViews) {
  ParamArena a;
  build(a);
  auto adam = make_optimizer(a, config_for("adam"));
  const auto st = adam->state();
  std::vector<std::string> names;
  for (const auto& [k, t] : st) names.push_back(k);
  EXPECT_EQ(names, (std::vector<std::string>{"float32.exp_avg", "float64.exp_avg", "float32.exp_avg_sq",
                                             "float64.exp_avg_sq", "step"}));
  EXPECT_EQ(st[0].second.numel(), a.params_flat(DType::f32).numel());  // same layout as the arena
  EXPECT_EQ(st[1].second.dtype(), DType::f64);
  EXPECT_EQ(st[4].second.dtype(), DType::i64);
  // state() hands out views: a write through one (an in-place broadcast) is the optimizer's state.
  st[4].second.data<std::int64_t>()[0] = 41;
  EXPECT_EQ(adam->steps(), 41);
  // SGD without momentum keeps only the step counter.
  OptimizerConfig plain;
  EXPECT_EQ(make_optimizer(a, plain)->state().size(), 1u);
}

TEST(OptimState, LoadStateRejectsMismatchesAndKeepsState) {
  ParamArena a;
  build(a);
  fill_params(a, 2);
  auto opt = make_optimizer(a, config_for("lamb"));
  run_steps(a, *opt, 0, 2);
  Optimizer::NamedTensors good;
  for (const auto& [k, t] : opt->state()) good.emplace_back(k, t.clone());

  auto expect_error = [&](Optimizer::NamedTensors bad, const std::string& needle) {
    try {
      opt->load_state(bad);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(opt->steps(), 2);  // untouched
    for (std::size_t k = 0; k < good.size(); ++k) EXPECT_TRUE(same_bytes(opt->state()[k].second, good[k].second));
  };
  auto missing = good;
  missing[1].first = "float64.momentum_buffer";
  expect_error(missing, "missing 'float64.exp_avg'");
  auto short_buf = good;
  short_buf[0].second = Tensor::zeros({10});
  expect_error(short_buf, "'float32.exp_avg' must be float32 with");
  auto wrong_dtype = good;
  wrong_dtype[4].second = Tensor::zeros({1}, DType::f32);
  expect_error(wrong_dtype, "'step' must be int64");
  auto negative = good;
  negative[4].second = Tensor::zeros({1}, DType::i64);
  negative[4].second.data<std::int64_t>()[0] = -3;
  expect_error(negative, "negative step count -3");
  auto too_few = good;
  too_few.pop_back();
  expect_error(too_few, "expected 5");
}

TEST(OptimState, DecayFalseParamsGetNoWeightDecay) {
  for (const char* name : kAll) {
    for (bool decay_all : {false, true}) {
      SCOPED_TRACE(std::string(name) + (decay_all ? " decay_all" : ""));
      ParamArena a;
      build(a);
      fill_params(a, 3);  // gradients stay zero: only weight decay can move a parameter
      OptimizerConfig c = config_for(name);
      c.weight_decay = 0.1;
      c.decay_all = decay_all;
      auto opt = make_optimizer(a, c);
      Tensor bias0 = a.param(1).clone(), big0 = a.param(0).clone(), w0 = a.param(2).clone();
      opt->step(0.1);
      opt->step(0.1);
      EXPECT_TRUE(opt->decays(0));
      EXPECT_EQ(opt->decays(1), decay_all);
      // decay=true tensors shrink toward zero
      auto norm = [](const Tensor& t) {
        double s = 0;
        for (std::int64_t i = 0; i < t.numel(); ++i) {
          double v = t.dtype() == DType::f64 ? t.data<double>()[i] : t.data<float>()[i];
          s += v * v;
        }
        return std::sqrt(s);
      };
      EXPECT_LT(norm(a.param(0)), norm(big0));
      EXPECT_LT(norm(a.param(2)), norm(w0));
      if (decay_all) EXPECT_LT(norm(a.param(1)), norm(bias0));
      else EXPECT_TRUE(same_bytes(a.param(1), bias0)) << "bias (decay=false) changed";
    }
  }
}

TEST(OptimState, ResultsDoNotDependOnThreadCount) {
  const int saved_threads = omp_get_max_threads();
  for (const char* name : kAll) {
    std::vector<Tensor> results;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      ParamArena a;
      build(a);
      fill_params(a, 4);
      auto opt = make_optimizer(a, config_for(name));
      run_steps(a, *opt, 0, 3);
      results.push_back(a.params_flat(DType::f32).clone());
    }
    EXPECT_TRUE(same_bytes(results[0], results[1])) << name << ": 1 vs 2 threads";
    EXPECT_TRUE(same_bytes(results[0], results[2])) << name << ": 1 vs 3 threads";
  }
  omp_set_num_threads(saved_threads);
}

// A float16/bfloat16 arena computes in float32 with float32 state and rounds the
// parameter on store: identical to a float32 arena rounded after every step.
template <typename H>
void check_half(const char* name) {
  SCOPED_TRACE(name);
  const DType hd = dtype_of<H>::value;
  auto round = [](float x) {
    H h;
    optim_math::store(h, x);
    return optim_math::load(h);
  };
  ParamArena half, ref;
  half.add("w", {1000}, hd, true);
  ref.add("w", {1000}, DType::f32, true);
  half.finalize();
  ref.finalize();
  H* hp = half.param(0).data<H>();
  H* hg = half.grad(0).data<H>();
  float* rp = ref.param(0).data<float>();
  float* rg = ref.grad(0).data<float>();
  for (int i = 0; i < 1000; ++i) {
    rp[i] = round(static_cast<float>(hash_value(9, i)));
    optim_math::store(hp[i], rp[i]);
  }
  auto oh = make_optimizer(half, config_for(name));
  auto orf = make_optimizer(ref, config_for(name));
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < 1000; ++i) {
      rg[i] = round(static_cast<float>(0.1 * hash_value(10 + s, i)));
      optim_math::store(hg[i], rg[i]);
    }
    oh->step(0.01);
    orf->step(0.01);
    for (int i = 0; i < 1000; ++i) rp[i] = round(rp[i]);
  }
  EXPECT_EQ(oh->state()[0].second.dtype(), DType::f32);
  int bad = 0;
  for (int i = 0; i < 1000; ++i) bad += optim_math::load(hp[i]) == rp[i] ? 0 : 1;
  EXPECT_EQ(bad, 0);
  EXPECT_TRUE(same_bytes(oh->state()[0].second, orf->state()[0].second));
}

TEST(OptimState, HalfPrecisionParamsUseFloat32State) {
  check_half<bfloat16>("adamw");
  check_half<float16>("adam");
  check_half<bfloat16>("lamb");
  check_half<float16>("sgd");
}

TEST(OptimGradUtils, UnscaleDetectsNonFinite) {
  ParamArena a;
  a.add("w", {3}, DType::f32, true);
  a.add("v", {1}, DType::f64, true);
  a.finalize();
  float* g = a.grad(0).data<float>();
  g[0] = 1024.f, g[1] = -2048.f, g[2] = 3.f;
  a.grad(1).data<double>()[0] = 512.0;
  EXPECT_TRUE(unscale_grads(a, 1.0 / 1024));
  EXPECT_EQ(g[0], 1.f);
  EXPECT_EQ(g[1], -2.f);
  EXPECT_EQ(g[2], 3.f / 1024);
  EXPECT_EQ(a.grad(1).data<double>()[0], 0.5);
  EXPECT_TRUE(grads_finite(a));
  a.grad(1).data<double>()[0] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(grads_finite(a));
  EXPECT_FALSE(unscale_grads(a, 0.5));
  a.grad(1).data<double>()[0] = 1.0;
  g[1] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(unscale_grads(a, 0.5));
  EXPECT_THROW(unscale_grads(a, 0.0), Error);
}

TEST(OptimGradUtils, GlobalNormAndClipping) {
  ParamArena a;
  a.add("w", {2}, DType::f32, true);
  a.add("v", {1}, DType::f64, false);
  a.finalize();
  a.grad(0).data<float>()[0] = 3.f;
  a.grad(0).data<float>()[1] = 4.f;
  a.grad(1).data<double>()[0] = 12.0;
  EXPECT_DOUBLE_EQ(grad_global_norm(a), 13.0);  // sqrt(9 + 16 + 144)
  EXPECT_DOUBLE_EQ(clip_grad_norm(a, 100.0), 13.0);  // below the limit: untouched
  EXPECT_EQ(a.grad(0).data<float>()[0], 3.f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(a, 1.3), 13.0);
  const double coef = 1.3 / (13.0 + 1e-6);  // torch.nn.utils.clip_grad_norm_
  EXPECT_FLOAT_EQ(a.grad(0).data<float>()[1], static_cast<float>(4.0 * coef));
  EXPECT_DOUBLE_EQ(a.grad(1).data<double>()[0], 12.0 * coef);
  EXPECT_NEAR(grad_global_norm(a), 1.3, 1e-6);
  EXPECT_THROW(clip_grad_norm(a, -1.0), Error);
}

TEST(OptimFactory, RejectsBadConfigurations) {
  ParamArena a;
  a.add("w", {4});
  a.finalize();
  auto message = [&](OptimizerConfig c) -> std::string {
    try {
      make_optimizer(a, c);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  OptimizerConfig c;
  c.name = "rmsprop";
  EXPECT_NE(message(c).find("unknown optimizer 'rmsprop'"), std::string::npos);
  c.name = "ADAMW";
  EXPECT_EQ(message(c), "");  // case-insensitive
  EXPECT_EQ(make_optimizer(a, c)->name(), "adamw");
  c = {};
  c.nesterov = true;
  EXPECT_NE(message(c).find("nesterov needs momentum > 0"), std::string::npos);
  c.name = "adam";
  EXPECT_NE(message(c).find("nesterov applies to sgd only"), std::string::npos);
  c = {};
  c.name = "adam";
  c.beta1 = 1.0;
  EXPECT_NE(message(c).find("beta1"), std::string::npos);
  c = {};
  c.weight_decay = -0.1;
  EXPECT_NE(message(c).find("weight_decay"), std::string::npos);
  c = {};
  c.name = "lars";
  c.trust_coefficient = 0;
  EXPECT_NE(message(c).find("trust_coefficient"), std::string::npos);

  auto sgd = make_optimizer(a, OptimizerConfig{});
  EXPECT_THROW(sgd->step(-0.1), Error);
  EXPECT_THROW(sgd->step(std::nan("")), Error);
  EXPECT_EQ(sgd->steps(), 0);

  ParamArena unfinished;
  unfinished.add("w", {4});
  EXPECT_THROW(make_optimizer(unfinished, OptimizerConfig{}), Error);
  ParamArena ints;
  ints.add("idx", {4}, DType::i32);
  ints.finalize();
  try {
    make_optimizer(ints, OptimizerConfig{});
    ADD_FAILURE() << "int32 parameters accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int32"), std::string::npos) << e.what();
  }
}
