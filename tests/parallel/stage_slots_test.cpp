// A pipeline stage keeps one copy of its layers and one MicroBatchState per
// micro-batch in flight. Reference: the same stage with ONE slot, running the
// micro-batches one after the other (forward, backward, forward, backward),
// which cannot mix two micro-batches' state. The several-slot stage runs all
// forwards first and the backwards afterwards (the weight halves after all
// input halves, as zero-bubble defers them), so every micro-batch's backward
// finds its own kept tensors, BatchNorm statistics, pooling indices, attention
// probabilities and dropout masks only if the swapping is right. Gradients,
// input gradients, outputs and running statistics must be bitwise equal.
#include <gtest/gtest.h>

#include <cstring>

#include "nn/layer_harness.hpp"
#include "ringtrain/core/allocator.hpp"
#include "ringtrain/nn/micro_batch_state.hpp"
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
  } else {  // cnn: fused conv + ReLU + max pooling on the CPU, dropout before the last Linear
    m.dropout = 0.25;
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

struct Run {
  std::vector<Tensor> out, dx;
  std::vector<Tensor> grads, buffers;
};

// interleaved: every forward first, then the backwards in reverse order
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
    st.set_position(7, mb * kRows);
    r.out[static_cast<std::size_t>(mb)] = st.forward(interleaved ? mb : 0, input(c, mb), Mode::train).clone();
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

void expect_same(const Run& a, const Run& b, const std::string& what) {
  for (int mb = 0; mb < kMicro; ++mb) {
    EXPECT_TRUE(same(a.out[static_cast<std::size_t>(mb)], b.out[static_cast<std::size_t>(mb)])) << what << ": output " << mb;
    if (a.dx[static_cast<std::size_t>(mb)].defined()) {
      EXPECT_TRUE(same(a.dx[static_cast<std::size_t>(mb)], b.dx[static_cast<std::size_t>(mb)])) << what << ": dx " << mb;
    }
  }
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(same(a.grads[i], b.grads[i])) << what << ": grad " << i;
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  for (std::size_t i = 0; i < a.buffers.size(); ++i) EXPECT_TRUE(same(a.buffers[i], b.buffers[i])) << what << ": buffer " << i;
}

class StageSlots : public ::testing::TestWithParam<std::string> {};

TEST_P(StageSlots, InterleavedMicroBatchesMatchOneAtATime) {
  const ModelConfig c = config(GetParam());
  for (bool fused : {true, false})
    for (Recompute rc : {Recompute::none, Recompute::attention, Recompute::block}) {
      const std::string what = GetParam() + (fused ? " fused" : " split") + " recompute " + std::to_string(int(rc));
      expect_same(run(c, true, rc, fused), run(c, false, rc, fused), what);
    }
}

INSTANTIATE_TEST_SUITE_P(Models, StageSlots, ::testing::Values("cnn", "resnet", "vit", "gpt"));

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
    st.set_position(1, 0);
    st.forward(0, input(c, 0), Mode::train);
    first = host_memory_stats().live - before;
  }
  Stage st(c, Device::cpu(), 0, n, 2);
  st.set_position(1, 0);
  st.forward(0, input(c, 0), Mode::train);
  const auto before = host_memory_stats().live;
  st.set_position(1, kRows);
  st.forward(1, input(c, 1), Mode::train);
  const std::size_t second = host_memory_stats().live - before;
  ASSERT_GT(copies, 0u);
  EXPECT_LE(second + copies, first) << "first forward " << first << " B, second micro-batch " << second
                                    << " B, weight copies " << copies << " B";
  EXPECT_GT(second, first / 4) << "the second micro-batch keeps activations of its own";
}

// A layer that does not list its state cannot be shared by micro-batches in
// flight: a stage of several slots refuses it by name; one slot runs it.
class Unlisted final : public Layer {
 public:
  Unlisted() : Layer("mine") {}
  const char* type() const override { return "Unlisted"; }
  Shape output_shape(const Shape& in) const override { return in; }

 protected:
  Tensor do_forward(const Tensor& x, Mode) override { return x; }
  Tensor do_backward(const Tensor& dy, bool, bool) override { return dy; }
};

TEST(StageSlotsErrors, AStageOfSeveralSlotsRefusesALayerThatDoesNotListItsState) {
  register_model("stage_slots_unlisted", [](const ModelConfig&) {
    std::vector<LayerPtr> l;
    l.push_back(std::make_unique<Unlisted>());
    l.push_back(std::make_unique<Flatten>("flatten"));
    return l;
  });
  ModelConfig c;
  c.name = "stage_slots_unlisted";
  EXPECT_NO_THROW(Stage(c, Device::cpu(), 0, 2, 1));
  try {
    Stage(c, Device::cpu(), 0, 2, 2);
    ADD_FAILURE() << "a stage of 2 slots accepted a layer that does not list its state";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mine (Unlisted)"), std::string::npos) << e.what();
  }
  // Members swap through a state: a fresh (undefined) value comes out, and back.
  MicroBatchState s;
  Tensor a = Tensor::zeros({2});
  s(a);
  EXPECT_FALSE(a.defined());
  s(a);
  EXPECT_TRUE(a.defined());
  EXPECT_EQ(a.numel(), 2);
}

}  // namespace
