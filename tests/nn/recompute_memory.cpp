// Stage::set_recompute on a whole vit (dropout on): `attention` and `block`
// give bitwise the gradients of `none` over three steps, and their peak host
// tensor memory over a step is lower (block: only the block inputs are kept).
#include <cstring>

#include "layer_harness.hpp"
#include "ringtrain/core/allocator.hpp"
#include "ringtrain/nn/loss.hpp"
#include "support/whole_model.hpp"

using namespace ringtrain;
using namespace rt_test;

namespace {

struct Outcome {
  std::vector<std::vector<char>> grads;  // after the last step
  std::vector<double> losses;
  std::size_t peak = 0;                  // tensor bytes above those live before the stage, last step
};

Outcome run(Recompute mode) {
  ModelConfig c;
  c.name = "vit";
  c.base_width = 64;
  c.heads = 4;
  c.depth = 4;
  c.mlp_ratio = 2.0;
  c.patch = 4;
  c.dropout = 0.1;
  const Tensor x = random_tensor({32, 1, 28, 28}, 2, 0.0, 1.0);
  Tensor y = Tensor::empty({32}, DType::i32);
  for (int i = 0; i < 32; ++i) y.data<std::int32_t>()[i] = (i * 7) % 10;
  const std::size_t before = host_memory_stats().live;
  Outcome r;
  Stage m(c, Device::cpu());
  m.set_recompute(mode);
  // The trainer's path without a deferred W (1 stage, afab, 1f1b). Under a
  // zero-bubble schedule a recomputed block keeps its replayed activations
  // until its W (the blocks defer their weight gradients), so `block` then
  // saves memory only between the micro-batches' I and their replays.
  m.set_fused_backward(true);
  for (int s = 0; s < 3; ++s) {
    if (s == 2) reset_host_memory_peak();  // buffers of `none` exist by now: a steady step
    m.zero_grads();
    LossResult l = softmax_cross_entropy(m.forward(0, x, Mode::train, {static_cast<std::uint64_t>(s), 0}), y);
    test_support::backward(m, l.dlogits);
    r.losses.push_back(l.loss);
  }
  r.peak = host_memory_stats().peak - before;
  for (std::size_t i = 0; i < m.arena().size(); ++i) {
    const Tensor g = m.arena().grad(i);
    r.grads.emplace_back(static_cast<const char*>(g.raw()), static_cast<const char*>(g.raw()) + g.nbytes());
  }
  return r;
}

}  // namespace

TEST(Recompute, BitwiseGradientsAndLessPeakMemoryOnAStage) {
  const Outcome none = run(Recompute::none), attn = run(Recompute::attention), block = run(Recompute::block);
  for (const Outcome* r : {&attn, &block}) {
    EXPECT_EQ(r->losses, none.losses);
    ASSERT_EQ(r->grads.size(), none.grads.size());
    for (std::size_t i = 0; i < none.grads.size(); ++i) EXPECT_TRUE(r->grads[i] == none.grads[i]) << "gradient " << i;
  }
  std::printf("peak tensor MB over a step: none %.2f, attention %.2f, block %.2f\n", none.peak / 1048576.0,
              attn.peak / 1048576.0, block.peak / 1048576.0);
  // attention frees the probabilities and their gradient scratch (1.2 MB each a block here) of
  // every block but the one in its backward: measured 60.7 -> 53.7 MB; block 17.4 MB.
  EXPECT_LT(attn.peak + 3 * 2 * 1000000, none.peak);
  EXPECT_LT(block.peak, none.peak / 2);
}
