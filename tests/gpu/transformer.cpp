// The CUDA transformer kernels (LayerNorm, attention on strided-batched
// cuBLAS, token ops) against the CPU backend on the same inputs, and a whole
// `vit` forward/backward on the GPU against the CPU: fp32 within 1e-5
// (max-norm relative), bf16 within 1e-2.
#include "gpu_test_util.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "support/whole_model.hpp"
#include "support/kernel_state.hpp"

using namespace ringtrain;
using namespace rt_gpu;

namespace {

Backend& cpu() { return backend_for(DeviceKind::cpu); }
Backend& gpu_be() { return backend_for(DeviceKind::cuda); }
double bound(DType dt) { return dt == DType::f32 ? 1e-5 : 1e-2; }

struct Pair {
  Tensor cpu, dev;
};
// The same (rounded to dt) values on both devices; the CPU copy in f32.
Pair make(const Shape& s, std::uint32_t seed, DType dt, float a = 1.0f) {
  Tensor low = host_cast(randu(s, seed, a), dt);
  Tensor back = Tensor::empty(s, DType::f32);
  auto v = host_f32(low);
  std::memcpy(back.raw(), v.data(), v.size() * 4);
  return {back, low.to(gpu())};
}
Tensor dev(const Shape& s, DType dt) { return Tensor::empty(s, dt, gpu()); }

}  // namespace

class CudaTransformerTest : public ::testing::TestWithParam<DType> {};

TEST_P(CudaTransformerTest, LayerNormForwardBackward) {
  const DType dt = GetParam();
  const std::int64_t d = 67;  // not a multiple of the warp
  const Shape xs{3, 11, d};
  LayerNormSpec sc;
  sc.features = d;
  LayerNormSpec sg = sc;
  sg.dtype = dt;
  Pair x = make(xs, 1, dt, 2.0f), g = make({d}, 2, dt), b = make({d}, 3, dt), dy = make(xs, 4, dt);
  auto kc = cpu().layernorm(sc);
  auto kg = gpu_be().layernorm(sg);
  Tensor yc = Tensor::empty(xs), yg = dev(xs, dt);
  kc->forward(x.cpu, g.cpu, b.cpu, yc, rt_test::state_of(*kc));
  kg->forward(x.dev, g.dev, b.dev, yg, rt_test::state_of(*kg));
  EXPECT_LE(rel_err(host_f32(yg), host_f32(yc)), bound(dt)) << "layernorm forward";
  Tensor dxc = Tensor::empty(xs), dgc = Tensor::empty({d}), dbc = Tensor::empty({d});
  Tensor dxg = dev(xs, dt), dgg = dev({d}, dt), dbg = dev({d}, dt);
  kc->backward(x.cpu, g.cpu, dy.cpu, dxc, dgc, dbc, false, rt_test::state_of(*kc));
  kg->backward(x.dev, g.dev, dy.dev, dxg, dgg, dbg, false, rt_test::state_of(*kg));
  EXPECT_LE(rel_err(host_f32(dxg), host_f32(dxc)), bound(dt)) << "layernorm dx";
  EXPECT_LE(rel_err(host_f32(dgg), host_f32(dgc)), bound(dt)) << "layernorm dgamma";
  EXPECT_LE(rel_err(host_f32(dbg), host_f32(dbc)), bound(dt)) << "layernorm dbeta";
  kg->backward(x.dev, g.dev, dy.dev, dxg, dgg, dbg, true, rt_test::state_of(*kg));  // accumulate: twice
  auto twice = host_f32(dgc);
  for (auto& v : twice) v *= 2;
  EXPECT_LE(rel_err(host_f32(dgg), twice), bound(dt)) << "layernorm dgamma accumulate";
}

TEST_P(CudaTransformerTest, AttentionForwardBackward) {
  const DType dt = GetParam();
  for (auto [H, hd, T] : {std::tuple<int, int, int>{4, 16, 49}, {3, 5, 7}, {1, 8, 1}}) {
    const Shape qs{5, T, 3 * H * hd}, os{5, T, H * hd};
    AttentionSpec sc{H, hd};
    AttentionSpec sg = sc;
    sg.dtype = dt;
    Pair qkv = make(qs, 5 + T, dt), dout = make(os, 6 + T, dt);
    auto kc = cpu().attention(sc);
    auto kg = gpu_be().attention(sg);
    Tensor oc = Tensor::empty(os), og = dev(os, dt);
    kc->forward(qkv.cpu, oc, rt_test::state_of(*kc));
    kg->forward(qkv.dev, og, rt_test::state_of(*kg));
    EXPECT_LE(rel_err(host_f32(og), host_f32(oc)), bound(dt)) << "attention forward H " << H << " T " << T;
    Tensor dc = Tensor::empty(qs), dg = dev(qs, dt);
    kc->backward(qkv.cpu, dout.cpu, dc, rt_test::state_of(*kc));
    kg->backward(qkv.dev, dout.dev, dg, rt_test::state_of(*kg));
    EXPECT_LE(rel_err(host_f32(dg), host_f32(dc)), bound(dt)) << "attention backward H " << H << " T " << T;
  }
}

TEST_P(CudaTransformerTest, TokenOps) {
  const DType dt = GetParam();
  const Shape img{2, 3, 8, 12}, tok{2, 6, 48};  // 4x4 patches: 2x3 of them, 3*16 features
  Pair x = make(img, 7, dt);
  Tensor tc = Tensor::empty(tok), tg = dev(tok, dt);
  cpu().patchify(x.cpu, 4, tc);
  gpu_be().patchify(x.dev, 4, tg);
  EXPECT_EQ(rel_err(host_f32(tg), host_f32(tc)), 0.0) << "patchify is a copy";
  Tensor ic = Tensor::empty(img), ig = dev(img, dt);
  gpu_be().unpatchify(tg, 4, ig);
  EXPECT_EQ(rel_err(host_f32(ig), host_f32(x.cpu)), 0.0) << "unpatchify inverts patchify";
  (void)ic;

  Pair b = make({6, 48}, 8, dt);
  Tensor ac = Tensor::empty(tok), ag = dev(tok, dt);
  cpu().add_broadcast(tc, b.cpu, 1, ac);
  gpu_be().add_broadcast(tg, b.dev, 1, ag);
  EXPECT_LE(rel_err(host_f32(ag), host_f32(ac)), bound(dt)) << "add_broadcast";
  Tensor sc = Tensor::empty({6, 48}), sg = dev({6, 48}, dt);
  cpu().sum_broadcast(ac, 1, sc, false);
  gpu_be().sum_broadcast(ag, 1, sg, false);
  EXPECT_LE(rel_err(host_f32(sg), host_f32(sc)), bound(dt)) << "sum_broadcast";
  // Per channel of images (a row-parallel conv's bias after its reduction): inner = H*W.
  Pair cb = make({3}, 10, dt);
  Tensor pc = Tensor::empty(img), pg = dev(img, dt);
  cpu().add_broadcast(x.cpu, cb.cpu, 8 * 12, pc);
  gpu_be().add_broadcast(x.dev, cb.dev, 8 * 12, pg);
  EXPECT_LE(rel_err(host_f32(pg), host_f32(pc)), bound(dt)) << "add_broadcast per channel";
  Tensor cc = Tensor::empty({3}), cg = dev({3}, dt);
  cpu().sum_broadcast(pc, 8 * 12, cc, false);
  gpu_be().sum_broadcast(pg, 8 * 12, cg, false);
  EXPECT_LE(rel_err(host_f32(cg), host_f32(cc)), bound(dt)) << "sum_broadcast per channel";

  Tensor mc = Tensor::empty({2, 48}), mg = dev({2, 48}, dt);
  cpu().token_mean(tc, mc);
  gpu_be().token_mean(tg, mg);
  EXPECT_LE(rel_err(host_f32(mg), host_f32(mc)), bound(dt)) << "token_mean";
  Pair dy = make({2, 48}, 9, dt);
  Tensor dc = Tensor::empty(tok), dg = dev(tok, dt);
  cpu().token_mean_backward(dy.cpu, dc);
  gpu_be().token_mean_backward(dy.dev, dg);
  EXPECT_LE(rel_err(host_f32(dg), host_f32(dc)), bound(dt)) << "token_mean backward";
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaTransformerTest, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

// The whole model: same seed on both devices, one forward/backward, every gradient.
TEST(CudaVit, ForwardBackwardMatchesCpu) {
  ModelConfig mc;
  mc.name = "vit";
  mc.depth = 2;
  mc.base_width = 32;
  mc.heads = 4;
  mc.mlp_ratio = 2;
  mc.patch = 7;
  Stage mcpu(mc, Device::cpu());
  Stage mgpu(mc, gpu());
  const int N = 16;
  Tensor x = randu({N, 1, 28, 28}, 31);
  Tensor y = Tensor::empty({N}, DType::i32);
  for (int i = 0; i < N; ++i) y.data<std::int32_t>()[i] = (i * 3) % 10;
  Tensor dc = Tensor::empty({N, 10}), dg = Tensor::empty({N, 10}, DType::f32, gpu());
  Tensor zc = mcpu.forward(0, x, Mode::train);
  Tensor zg = mgpu.forward(0, x.to(gpu()), Mode::train);
  EXPECT_LE(rel_err(host_f32(zg), host_f32(zc)), 1e-5) << "logits";
  const double lc = cpu().softmax_xent(zc, y, 0.0, dc);
  const double lg = gpu_be().softmax_xent(zg, y.to(gpu()), 0.0, dg);
  EXPECT_NEAR(lg, lc, 1e-5 * lc);
  mcpu.zero_grads();
  mgpu.zero_grads();
  test_support::backward(mcpu, dc);
  test_support::backward(mgpu, dg);
  gpu_be().synchronize();
  for (std::size_t i = 0; i < mcpu.arena().size(); ++i)
    EXPECT_LE(rel_err(host_f32(mgpu.arena().grad(i)), host_f32(mcpu.arena().grad(i))), 1e-4)
        << mcpu.arena().info(i).name;
}
