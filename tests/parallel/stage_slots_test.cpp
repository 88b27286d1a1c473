// A pipeline stage keeps one copy of its layers and, per micro-batch in
// flight, one context per layer (Layer::make_ctx). Reference: the same stage
// with ONE slot, running the micro-batches one after the other (forward,
// backward, forward, backward), which cannot mix two micro-batches' state.
// The several-slot stage runs all forwards first and the backwards
// afterwards, so every micro-batch's backward finds its own kept tensors,
// BatchNorm statistics, pooling indices, attention probabilities and dropout
// masks only if every layer keeps them in its context. Gradients, input
// gradients, outputs and running statistics must be bitwise equal; a layer
// that keeps its input in a member is caught.
#include <gtest/gtest.h>

#include <cstring>

#include "nn/layer_harness.hpp"
#include "ringtrain/core/allocator.hpp"
#include "ringtrain/nn/model_registry.hpp"
#include "ringtrain/parallel/stage.hpp"

using namespace ringtrain;
using namespace rt_test;

namespace {

constexpr int kMicro = 3;
constexpr std::int64_t kRows = 4;  // samples per micro-batch

ModelConfig config(const std::string& name) {
  ModelConfig m;
  m.name = name;
  if (name == "resnet") {
    m.in_channels = 3, m.height = m.width = 16, m.depth = 8, m.base_width = 8;
  } else if (name == "vit") {
    m.in_channels = 1, m.height = m.width = 16, m.patch = 4, m.base_width = 32, m.depth = 2, m.heads = 4;
    m.dropout = 0.1;  // masks keyed by the micro-batch's position: a mixed-up replay differs
  } else if (name == "gpt") {
    m.seq_len = 16, m.classes = 64, m.base_width = 32, m.depth = 2, m.heads = 4, m.dropout = 0.1;
  } else if (name == "cnn") {  // fused conv + ReLU + max pooling on the CPU, dropout before the last Linear
    m.dropout = 0.25;
  } else {  // a test model (registered below): 8 features
    m.in_channels = 1, m.height = 2, m.width = 4;
  }
  return m;
}

Tensor input(const ModelConfig& c, int mb) {
  if (c.seq_len == 0) return random_tensor(model_input_shape(c, kRows), 100 + static_cast<std::uint64_t>(mb));
  Tensor ids = Tensor::empty(model_input_shape(c, kRows));
  for (std::int64_t i = 0; i < ids.numel(); ++i) ids.data<float>()[i] = static_cast<float>((i * 7 + 3 * mb) % c.classes);
  return ids;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

SamplePosition at(int mb) { return {7, mb * kRows}; }

struct Run {
  std::vector<Tensor> out, dx;
  std::vector<Tensor> grads, buffers;  // grads: per micro-batch (reversed runs) or summed
};

// interleaved: every forward first, then the backwards in micro-batch order
// (weight halves after all input halves); else one micro-batch at a time.
Run run(const ModelConfig& c, bool interleaved, Recompute rc, bool fused) {
  Stage st(c, Device::cpu(), 0, static_cast<int>(plan_model_layers(c).size()), interleaved ? kMicro : 1);
  st.set_recompute(rc);
  st.set_fused_backward(fused);
  st.zero_grads();
  Run r;
  r.out.resize(kMicro);
  r.dx.resize(kMicro);
  auto fwd = [&](int mb) {
    r.out[static_cast<std::size_t>(mb)] = st.forward(interleaved ? mb : 0, input(c, mb), Mode::train, at(mb)).clone();
  };
  auto bwd = [&](int mb, bool weight) {
    const int slot = interleaved ? mb : 0;
    const Tensor dy = random_tensor(r.out[static_cast<std::size_t>(mb)].shape(), 200 + static_cast<std::uint64_t>(mb));
    const Tensor dx = st.backward_input(slot, dy, c.seq_len == 0);
    if (dx.defined()) r.dx[static_cast<std::size_t>(mb)] = dx.clone();
    if (weight) st.backward_weight(slot);
  };
  if (interleaved) {
    // In micro-batch order, as the one-at-a-time run adds the gradients up
    // (float sums in another order would differ in the last bits).
    for (int mb = 0; mb < kMicro; ++mb) fwd(mb);
    for (int mb = 0; mb < kMicro; ++mb) bwd(mb, false);
    for (int mb = 0; mb < kMicro; ++mb) st.backward_weight(mb);
  } else {
    for (int mb = 0; mb < kMicro; ++mb) {
      fwd(mb);
      bwd(mb, true);
    }
  }
  for (std::size_t i = 0; i < st.arena().size(); ++i) r.grads.push_back(st.arena().grad(i).clone());
  for (auto& b : st.buffers()) r.buffers.push_back(b.tensor.clone());
  return r;
}

// Every forward first, then the backwards in REVERSE order, each micro-batch's
// gradients taken alone (zero_grads before it); the reference runs each
// micro-batch alone through one slot, in forward order.
Run run_reversed(const ModelConfig& c, bool interleaved, bool fused) {
  Stage st(c, Device::cpu(), 0, static_cast<int>(plan_model_layers(c).size()), interleaved ? kMicro : 1);
  st.set_fused_backward(fused);
  Run r;
  r.out.resize(kMicro);
  r.dx.resize(kMicro);
  std::vector<std::vector<Tensor>> grads(kMicro);
  auto bwd = [&](int mb) {
    const int slot = interleaved ? mb : 0;
    st.zero_grads();
    const Tensor dy = random_tensor(r.out[static_cast<std::size_t>(mb)].shape(), 200 + static_cast<std::uint64_t>(mb));
    const Tensor dx = st.backward_input(slot, dy, c.seq_len == 0);
    if (dx.defined()) r.dx[static_cast<std::size_t>(mb)] = dx.clone();
    st.backward_weight(slot);
    for (std::size_t i = 0; i < st.arena().size(); ++i) grads[static_cast<std::size_t>(mb)].push_back(st.arena().grad(i).clone());
  };
  for (int mb = 0; mb < kMicro; ++mb) {
    r.out[static_cast<std::size_t>(mb)] = st.forward(interleaved ? mb : 0, input(c, mb), Mode::train, at(mb)).clone();
    if (!interleaved) bwd(mb);
  }
  if (interleaved)
    for (int mb = kMicro; mb-- > 0;) bwd(mb);
  for (auto& g : grads) r.grads.insert(r.grads.end(), g.begin(), g.end());
  for (auto& b : st.buffers()) r.buffers.push_back(b.tensor.clone());
  return r;
}

// Whether a and b agree bitwise; with `report`, every difference is a failure.
bool agree(const Run& a, const Run& b, const std::string& what, bool report = true) {
  bool ok = true;
  auto check = [&](bool eq, const std::string& item) {
    if (!eq && report) ADD_FAILURE() << what << ": " << item;
    ok = ok && eq;
  };
  for (std::size_t mb = 0; mb < kMicro; ++mb) {
    check(same(a.out[mb], b.out[mb]), "output " + std::to_string(mb));
    if (a.dx[mb].defined()) check(same(a.dx[mb], b.dx[mb]), "dx " + std::to_string(mb));
  }
  check(a.grads.size() == b.grads.size(), "gradient count");
  for (std::size_t i = 0; i < a.grads.size() && i < b.grads.size(); ++i) check(same(a.grads[i], b.grads[i]), "grad " + std::to_string(i));
  check(a.buffers.size() == b.buffers.size(), "buffer count");
  for (std::size_t i = 0; i < a.buffers.size() && i < b.buffers.size(); ++i)
    check(same(a.buffers[i], b.buffers[i]), "buffer " + std::to_string(i));
  return ok;
}

class StageSlots : public ::testing::TestWithParam<std::string> {};

TEST_P(StageSlots, InterleavedMicroBatchesMatchOneAtATime) {
  const ModelConfig c = config(GetParam());
  for (bool fused : {true, false})
    for (Recompute rc : {Recompute::none, Recompute::attention, Recompute::block}) {
      const std::string what = GetParam() + (fused ? " fused" : " split") + " recompute " + std::to_string(int(rc));
      agree(run(c, true, rc, fused), run(c, false, rc, fused), what);
    }
}

TEST_P(StageSlots, BackwardsInReverseOrderGiveEachMicroBatchItsOwnGradients) {
  const ModelConfig c = config(GetParam());
  for (bool fused : {true, false})
    agree(run_reversed(c, true, fused), run_reversed(c, false, fused), GetParam() + (fused ? " fused" : " split"));
}

INSTANTIATE_TEST_SUITE_P(Models, StageSlots, ::testing::Values("cnn", "resnet", "vit", "gpt"));

// A layer that keeps its input in a member (mutable, so that its const
// forward may write it) instead of its context: y = x * x, dx = 2 x dy with
// the LAST forward's x. The reversed run must catch it.
class Cheater final : public Layer {
 public:
  Cheater() : Layer("cheat") {}
  const char* type() const override { return "Cheater"; }
  Shape output_shape(const Shape& in) const override { return in; }
  CtxPtr make_ctx() const override { return std::make_unique<Ctx>(); }

 protected:
  Tensor do_forward(const Tensor& x, Ctx&, const Call&) const override {
    x_ = x;
    Tensor y = Tensor::empty(x.shape());
    for (std::int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = x.data<float>()[i] * x.data<float>()[i];
    return y;
  }
  Tensor do_backward(const Tensor& dy, Ctx&, bool, bool) const override {
    Tensor dx = Tensor::empty(dy.shape());
    for (std::int64_t i = 0; i < dy.numel(); ++i) dx.data<float>()[i] = 2 * x_.data<float>()[i] * dy.data<float>()[i];
    return dx;
  }

 private:
  mutable Tensor x_;
};

TEST(StageSlotsCheck, ALayerKeepingStateOutsideItsContextIsCaught) {
  register_model("stage_slots_cheater", [](const ModelConfig&) {
    std::vector<LayerPtr> l;
    l.push_back(std::make_unique<Flatten>("flatten"));
    l.push_back(std::make_unique<Linear>("fc1", LinearSpec{8, 6, true, false}));
    l.push_back(std::make_unique<Cheater>());
    l.push_back(std::make_unique<Linear>("fc2", LinearSpec{6, 3, true, false}));
    return l;
  });
  const ModelConfig c = config("stage_slots_cheater");
  for (bool fused : {true, false}) {
    // One at a time it is right; interleaved, the earlier micro-batches get the last one's input.
    EXPECT_FALSE(agree(run_reversed(c, true, fused), run_reversed(c, false, fused), "cheater", false))
        << "the reversed backwards did not notice a layer that keeps its input in a member";
  }
}

// A context belongs to one layer type: another layer's is an error naming the layer.
TEST(StageSlotsCheck, AnotherLayersContextIsAnError) {
  Linear fc("fc", LinearSpec{4, 2, true, false});
  Activation relu("relu", Eltwise::relu);
  CtxPtr wrong = relu.make_ctx();
  try {
    fc.forward(Tensor::zeros({1, 4}), *wrong, Mode::train);
    ADD_FAILURE() << "a Linear ran with a ReLU's context";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fc'"), std::string::npos) << e.what();
  }
}

// The layers exist once whatever the slot count: in bf16, a second
// micro-batch in flight adds its activations, not another set of bfloat16
// weight copies (nor kernel caches), which a first forward creates.
TEST(StageSlotsMemory, ASecondMicroBatchAddsActivationsNotWeightCopies) {
  ModelConfig c = config("vit");
  c.math = MathMode::bf16;
  const int n = static_cast<int>(plan_model_layers(c).size());
  std::size_t copies = 0;  // bytes of the bf16 copies: every 2-D weight (Linear)
  std::size_t first = 0;   // what a first forward allocates
  {
    Stage st(c, Device::cpu(), 0, n, 1);
    ASSERT_EQ(st.activation_dtype(), DType::bf16);
    for (std::size_t i = 0; i < st.arena().size(); ++i) {
      const auto& info = st.arena().info(i);
      if (info.shape.size() == 2 && info.name.ends_with(".weight")) copies += 2 * static_cast<std::size_t>(shape_numel(info.shape));
    }
    const auto before = host_memory_stats().live;
    st.forward(0, input(c, 0), Mode::train, {1, 0});
    first = host_memory_stats().live - before;
  }
  Stage st(c, Device::cpu(), 0, n, 2);
  st.forward(0, input(c, 0), Mode::train, {1, 0});
  const auto before = host_memory_stats().live;
  st.forward(1, input(c, 1), Mode::train, {1, kRows});
  const std::size_t second = host_memory_stats().live - before;
  ASSERT_GT(copies, 0u);
  EXPECT_LE(second + copies, first) << "first forward " << first << " B, second micro-batch " << second
                                    << " B, weight copies " << copies << " B";
  EXPECT_GT(second, first / 4) << "the second micro-batch keeps activations of its own";
}

}  // namespace
