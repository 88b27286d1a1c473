// A rank may hold several chunks of the model in one Stage (one arena).
// Reference: one single-chunk Stage per chunk, built from the same
// ModelConfig. Forward outputs, input gradients and every parameter's initial
// value and gradient (matched by name) must be bitwise equal; local layer
// indices number the layers across chunks. A tied LM head whose embedding is
// in another chunk of the same rank shares its weight (one parameter, the
// head's and the embedding's gradients summed in the arena).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "nn/layer_harness.hpp"
#include "ringtrain/nn/model_registry.hpp"
#include "ringtrain/parallel/stage.hpp"

using namespace ringtrain;
using namespace rt_test;

namespace {

constexpr std::int64_t kRows = 4;

ModelConfig config(const std::string& name) {
  ModelConfig m;
  m.name = name;
  if (name == "resnet") {
    m.in_channels = 3, m.height = m.width = 16, m.depth = 8, m.base_width = 8;
  } else if (name == "vit") {
    m.in_channels = 1, m.height = m.width = 16, m.patch = 4, m.base_width = 32, m.depth = 3, m.heads = 4;
    m.dropout = 0.1;
  } else if (name == "gpt") {
    m.seq_len = 16, m.classes = 64, m.base_width = 32, m.depth = 3, m.heads = 4, m.dropout = 0.1;
  } else {
    m.dropout = 0.25;
  }
  return m;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// An input for chunk c of `st`: token ids for a model's first layer, else activations.
Tensor input_for(const ModelConfig& mc, const Shape& s, bool ids, std::uint64_t seed) {
  if (!ids) return random_tensor(s, seed);
  Tensor t = Tensor::empty(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>((i * 5 + 1) % mc.classes);
  return t;
}

struct Pass {
  Tensor out, dx;
};

// forward, backward_input, backward_weight of one chunk, slot 0.
Pass run(Stage& st, int chunk, const ModelConfig& mc, std::uint64_t seed) {
  const bool ids = mc.seq_len > 0 && st.chunk(chunk).first == 0;
  const Tensor x = input_for(mc, st.input_shape(chunk, kRows), ids, seed);
  Pass p;
  p.out = st.forward(chunk, 0, x, Mode::train, {3, 2 * kRows}).clone();
  const Tensor dy = random_tensor(p.out.shape(), seed + 1);
  const Tensor dx = st.backward_input(chunk, 0, dy, !ids);
  if (dx.defined()) p.dx = dx.clone();
  st.backward_weight(chunk, 0);
  return p;
}

std::map<std::string, std::pair<Tensor, Tensor>> params_by_name(Stage& st) {
  std::map<std::string, std::pair<Tensor, Tensor>> m;
  for (std::size_t i = 0; i < st.arena().size(); ++i)
    m[st.arena().info(i).name] = {st.arena().param(i).clone(), st.arena().grad(i).clone()};
  return m;
}

class StageChunks : public ::testing::TestWithParam<std::string> {};

TEST_P(StageChunks, TwoChunksMatchTheirSingleChunkStages) {
  const ModelConfig mc = config(GetParam());
  const int n = static_cast<int>(plan_model_layers(mc).size());
  ASSERT_GE(n, 4);
  // {0..a}, {b..n}: a gap between them (another rank's chunk), the model's ends on this rank.
  const int a = 1, b = n - 2;
  for (bool fused : {false, true}) {
    Stage two(mc, Device::cpu(), std::vector<LayerRange>{{0, a}, {b, n}}, 2);
    Stage first(mc, Device::cpu(), 0, a, 1), last(mc, Device::cpu(), b, n, 1);
    ASSERT_EQ(two.num_chunks(), 2);
    EXPECT_EQ(two.chunk(1).first, b);
    EXPECT_EQ(two.num_layers(), a + n - b);
    EXPECT_EQ(two.input_shape(1, kRows), last.input_shape(kRows));
    EXPECT_EQ(two.output_shape(0, kRows), first.output_shape(kRows));
    for (Stage* s : {&two, &first, &last}) {
      s->set_fused_backward(fused);
      s->zero_grads();
    }
    // The later chunk's backward first, as a schedule runs a micro-batch.
    const Pass t1 = run(two, 1, mc, 10), r1 = run(last, 0, mc, 10);
    const Pass t0 = run(two, 0, mc, 20), r0 = run(first, 0, mc, 20);
    const std::string what = GetParam() + (fused ? " fused" : " split");
    EXPECT_TRUE(same(t0.out, r0.out)) << what << ": chunk 0 output";
    EXPECT_TRUE(same(t1.out, r1.out)) << what << ": chunk 1 output";
    EXPECT_TRUE(same(t1.dx, r1.dx)) << what << ": chunk 1 input gradient";
    if (r0.dx.defined()) EXPECT_TRUE(same(t0.dx, r0.dx)) << what << ": chunk 0 input gradient";

    auto mine = params_by_name(two), f = params_by_name(first), l = params_by_name(last);
    std::size_t tied = 0;
    for (auto& [name, pg] : mine) {
      const bool in_f = f.count(name) > 0, in_l = l.count(name) > 0;
      ASSERT_TRUE(in_f || in_l) << what << ": " << name << " is in neither single-chunk stage";
      if (in_f && in_l) {  // a tied weight: one parameter here, the head's copy on the last stage
        ++tied;
        EXPECT_TRUE(same(pg.first, f[name].first) && same(pg.first, l[name].first)) << what << ": " << name;
        // Here the embedding adds its part to the head's in the arena; the
        // stages' sum runs in the other order: float rounding only (measured
        // at most ~1e-8 on these sizes; bound 1e-6 relative to the largest entry).
        const Tensor& g = pg.second;
        float big = 0;
        for (std::int64_t i = 0; i < g.numel(); ++i) big = std::max(big, std::fabs(g.data<float>()[i]));
        for (std::int64_t i = 0; i < g.numel(); ++i) {
          const float want = f[name].second.data<float>()[i] + l[name].second.data<float>()[i];
          ASSERT_NEAR(g.data<float>()[i], want, 1e-6f * big) << what << ": " << name << " [" << i << "]";
        }
        continue;
      }
      auto& ref = in_f ? f[name] : l[name];
      EXPECT_TRUE(same(pg.first, ref.first)) << what << ": initial " << name;
      EXPECT_TRUE(same(pg.second, ref.second)) << what << ": gradient " << name;
    }
    EXPECT_EQ(mine.size() + tied, f.size() + l.size()) << what;
    EXPECT_EQ(tied, GetParam() == "gpt" ? 1u : 0u) << what;
    EXPECT_TRUE(two.arena().tied().empty()) << what << ": a shared weight is no copy";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, StageChunks, ::testing::Values("cnn", "resnet", "vit", "gpt"));

// GradReady and ParamAccess number the rank's layers across chunks.
TEST(StageChunksHooks, LocalIndicesNumberTheLayersAcrossChunks) {
  const ModelConfig mc = config("cnn");
  const int n = static_cast<int>(plan_model_layers(mc).size());
  Stage st(mc, Device::cpu(), std::vector<LayerRange>{{0, 2}, {n - 2, n}}, 1);
  struct Log final : ParamAccess {
    std::vector<int> fwd;
    void use(int l, Pass p) override {
      if (p == Pass::forward) fwd.push_back(l);
    }
    void end_pass() override {}
  } log;
  st.set_param_access(&log);
  st.set_fused_backward(true);
  st.zero_grads();
  const Tensor y = st.forward(1, 0, random_tensor(st.input_shape(1, kRows), 1), Mode::train, {});
  std::vector<int> ready;
  st.backward_input(1, 0, random_tensor(y.shape(), 2), true, [&](int l) { ready.push_back(l); });
  EXPECT_EQ(log.fwd, (std::vector<int>{2, 3}));
  ASSERT_FALSE(ready.empty());
  for (int l : ready) {
    EXPECT_GE(l, 2);
    EXPECT_FALSE(st.layer(l).params().empty());
    for (std::size_t p : st.layer(l).params()) EXPECT_EQ(st.arena().info(p).layer, n - 2 + (l - 2));
  }
}

TEST(StageChunksErrors, ChunksMustAscend) {
  const ModelConfig mc = config("cnn");
  EXPECT_THROW(Stage(mc, Device::cpu(), std::vector<LayerRange>{{2, 3}, {0, 1}}, 1), Error);
  EXPECT_THROW(Stage(mc, Device::cpu(), std::vector<LayerRange>{{0, 2}, {1, 3}}, 1), Error);
}

}  // namespace
