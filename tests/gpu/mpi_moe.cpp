// Mixture of experts on the GPU (issue 45, item 2; issue 43's "CUDA for MoE"):
// the MoE layer's loops are Backend ops (CUDA: kernels/moe.cu, cuda/nn/moe.cpp;
// CPU: backend/cpu/moe_ops.cpp) and its device path (src/nn/moe_device.cpp)
// runs on device tensors, the expert all-to-all staged through host copies.
//  - The ops against the CPU backend on the same inputs: the router's top-k
//    identical (tied logits and a selection bias included), probabilities,
//    gates and sums, the row gather bitwise, the combine and its backward, the
//    router's backward, the strided batched GEMM (transposes, beta 0 and 1).
//    Bounds: float32 roundings in another order (CUDA's exp within 1 ulp,
//    FMA contraction): 1e-6 absolute on values of order 1, d gates (sums
//    of 40 products) 1e-5, the GEMM 1e-5 relative. The emulator of these
//    kernels on the CPU (same compiler, no FMA difference) measured them
//    bitwise equal to the CPU loops (docs/data/gpu_moe_emulated.txt).
//  - The whole layer, forward and backward, on device tensors against the
//    same layer on host tensors with the same weights: at 1 rank (each rank
//    alone) and at parallel.expert = 2 over the world at 2 ranks, dropless and
//    with capacity drops. Bound 2e-5 relative: cuBLAS against oneDNN/OpenBLAS
//    sum the GEMMs in other orders (the dense layers' GPU tests measure ~1e-6).
//  - gpt with model.experts = 4, top_k = 2 as a trial past the gate ("mixture
//    of experts"; at 2 ranks also parallel.expert = 2, "expert parallelism")
//    against the 1-rank CPU fp32 run, as mpi_gpt.cpp does. Bound 1e-6
//    relative: ~10x the worst an H200 measured at 1-4 ranks, expert 1 and 2
//    (1.1e-7, docs/data/gpu/19-*). The first runs there failed on the test's
//    own reference at 2 ranks (the aux loss is per micro-batch: the 1-rank run
//    now takes the ranks' micro-batches) and on two real bugs: a raw MPI
//    broadcast of device parameters (expert 2 at start) and two engines
//    sharing one set of device byte movers (expert 2 x data 2 drifted 1.6e-3).
//    The features are on the gate's list since.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "gpu_test_util.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/moe.hpp"
#include "ringtrain/nn/parameters.hpp"
#include "ringtrain/train/gpu_gate.hpp"
#include "train/gpt_fixtures.hpp"
#include "vit_trainer.hpp"

using namespace ringtrain;
using namespace rt_gpu;

namespace {

Backend& cpu() { return backend_for(DeviceKind::cpu); }
Backend& cuda_be() { return backend_for(DeviceKind::cuda); }

template <typename T>
std::vector<T> host_vec(const Tensor& t) {
  const Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  std::vector<T> v(std::size_t(h.numel()));
  if (!v.empty()) std::memcpy(v.data(), h.raw(), h.nbytes());
  return v;
}
template <typename T>
Tensor host_tensor(const std::vector<T>& v, const Shape& s) {
  Tensor t = Tensor::empty(s, dtype_of<T>::value);
  if (!v.empty()) std::memcpy(t.raw(), v.data(), t.nbytes());
  return t;
}
double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  double w = 0;
  for (std::size_t i = 0; i < a.size() && a.size() == b.size(); ++i) w = std::max(w, std::fabs(double(a[i]) - b[i]));
  return a.size() == b.size() ? w : INFINITY;
}

}  // namespace

TEST(GpuMoe, OpsMatchTheCpuBackend) {
  for (int ties = 0; ties < 2; ++ties) {
    const std::int64_t n = 150, D = 40;
    const int E = 8, k = 2;
    Tensor logits = randu({n, E}, 3 + ties, 3.f);
    if (ties)  // integer logits: many equal probabilities, broken to the lower expert on both
      for (std::int64_t i = 0; i < logits.numel(); ++i) logits.data<float>()[i] = std::round(logits.data<float>()[i]);
    Tensor bias = randu({E}, 5, 0.05f);
    if (ties) for (int e = 0; e < E; ++e) bias.data<float>()[e] = 0.05f * float(e % 3);
    // Router.
    Tensor pc = logits.clone(), pg = logits.to(gpu());
    Tensor ec = Tensor::empty({n, k}, DType::i32), eg = Tensor::empty({n, k}, DType::i32, gpu());
    Tensor gc = Tensor::empty({n, k}), gg = Tensor::empty({n, k}, DType::f32, gpu());
    Tensor sc = Tensor::empty({E}, DType::f64), sg = Tensor::empty({E}, DType::f64, gpu());
    cpu().moe_route(pc, bias, k, ec, gc, sc);
    cuda_be().moe_route(pg, bias.to(gpu()), k, eg, gg, sg);
    EXPECT_EQ(host_vec<std::int32_t>(eg), host_vec<std::int32_t>(ec)) << "top-k experts, ties " << ties;
    const double dp = max_abs(host_f32(pg), host_f32(pc)), dg = max_abs(host_f32(gg), host_f32(gc));
    EXPECT_LE(dp, 1e-6) << "probabilities";
    EXPECT_LE(dg, 1e-6) << "gates";
    const std::vector<double> a = host_vec<double>(sg), b = host_vec<double>(sc);
    for (int e = 0; e < E; ++e) EXPECT_NEAR(a[e], b[e], 1e-6 * n) << "probability sum of expert " << e;
    // Rows in expert order and back (pads of -1), then the combine.
    const std::int64_t R = n * k;
    std::vector<std::int64_t> idx(std::size_t(R) + 3), row(static_cast<std::size_t>(R)), tokens;
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i % 9 == 4 ? -1 : std::int64_t((i * 7 + 2) % std::size_t(n));
    // Each (token, slot) owns its row, as the dispatch makes it (7 is prime to R = 300): the combine's
    // backward writes d rows, which a shared row would make depend on the order of the writes.
    for (std::int64_t q = 0; q < R; ++q) row[std::size_t(q)] = q % 6 == 5 ? -1 : (q * 7) % R;
    for (std::int64_t t = 1; t < n; t += 3) tokens.push_back(t);
    const Tensor x = randu({n, D}, 9), ti = host_tensor(idx, {std::int64_t(idx.size())});
    Tensor rc = Tensor::empty({std::int64_t(idx.size()), D}), rg = Tensor::empty(rc.shape(), DType::f32, gpu());
    cpu().moe_gather_rows(x, ti, rc);
    cuda_be().moe_gather_rows(x.to(gpu()), ti.to(gpu()), rg);
    EXPECT_EQ(host_f32(rg), host_f32(rc)) << "gathered rows";
    const Tensor rows = randu({R, D}, 11), tr = host_tensor(row, {R});
    const Tensor tt = host_tensor(tokens, {std::int64_t(tokens.size())});
    Tensor yc = randu({n, D}, 12), yg = yc.to(gpu());
    cpu().moe_combine(rows, tr, gc, k, Tensor(), yc, false);
    cuda_be().moe_combine(rows.to(gpu()), tr.to(gpu()), gg, k, Tensor(), yg, false);
    const double d_all = max_abs(host_f32(yg), host_f32(yc));
    cpu().moe_combine(rows, tr, Tensor(), k, tt, yc, true);
    cuda_be().moe_combine(rows.to(gpu()), tr.to(gpu()), Tensor(), k, tt.to(gpu()), yg, true);
    const double d_list = max_abs(host_f32(yg), host_f32(yc));
    EXPECT_LE(d_all, 1e-6) << "combine";
    EXPECT_LE(d_list, 1e-6) << "combine of a token list, accumulating, gates of 1";
    // Backward of the combine and of the router.
    const Tensor dy = randu({n, D}, 13);
    Tensor dgc = Tensor::empty({R}), dgg = Tensor::empty({R}, DType::f32, gpu());
    Tensor drc = Tensor::zeros({R, D}), drg = Tensor::zeros({R, D}, DType::f32, gpu());
    cpu().moe_combine_backward(dy, rows, tr, gc, k, dgc, drc);
    cuda_be().moe_combine_backward(dy.to(gpu()), rows.to(gpu()), tr.to(gpu()), gg, k, dgg, drg);
    const double d_dgate = max_abs(host_f32(dgg), host_f32(dgc)), d_drows = max_abs(host_f32(drg), host_f32(drc));
    EXPECT_LE(d_dgate, 1e-5) << "d gates (sums of 40 products of order 1)";
    EXPECT_LE(d_drows, 1e-6) << "d rows";
    Tensor f = randu({E}, 14, 0.2f);
    Tensor dlc = Tensor::empty({n, E}), dlg = Tensor::empty({n, E}, DType::f32, gpu());
    // Both from the CPU's routing (its probabilities, experts, gates and d gates): the op alone.
    cpu().moe_router_backward(pc, ec, gc, dgc, f, 0.02, dlc);
    cuda_be().moe_router_backward(pc.to(gpu()), ec.to(gpu()), gc.to(gpu()), dgc.to(gpu()), f.to(gpu()), 0.02, dlg);
    const double d_dlogit = max_abs(host_f32(dlg), host_f32(dlc));
    EXPECT_LE(d_dlogit, 1e-6) << "d logits";
    std::printf("[moe ops] ties %d: probs %.1e, gates %.1e, combine %.1e / %.1e, d gates %.1e, d rows %.1e, "
                "d logits %.1e\n",
                ties, dp, dg, d_all, d_list, d_dgate, d_drows, d_dlogit);
  }
  // The strided batched GEMM: 3 blocks of [m, k] x [k, n]^T and a transposed weight-gradient form, beta 0 and 1.
  const std::int64_t B = 3, m = 24, nn = 20, kk = 16;
  const Tensor A = randu({B, m, kk}, 21), W = randu({B, nn, kk}, 22), G = randu({B, m, nn}, 23);
  for (int form = 0; form < 2; ++form) {
    const bool wgrad = form == 1;  // C [nn, kk] = G^T A, accumulated onto C
    const Shape cs = wgrad ? Shape{B, nn, kk} : Shape{B, m, nn};
    Tensor cc = randu(cs, 24), cg = cc.to(gpu());
    const Tensor Ag = A.to(gpu()), Wg = W.to(gpu()), Gg = G.to(gpu());
    auto call = [&](Backend& be, const Tensor& a, const Tensor& w, const Tensor& g, Tensor& c, Device dev) {
      if (!wgrad)
        be.batched_gemm(dev, {false, true, m, nn, kk, 1.f, a.device_data<float>(), kk, m * kk, w.device_data<float>(),
                              kk, nn * kk, 0.f, c.device_data<float>(), nn, m * nn, B});
      else
        be.batched_gemm(dev, {true, false, nn, kk, m, 0.5f, g.device_data<float>(), nn, m * nn,
                              a.device_data<float>(), kk, m * kk, 1.f, c.device_data<float>(), kk, nn * kk, B});
    };
    call(cpu(), A, W, G, cc, Device::cpu());
    call(cuda_be(), Ag, Wg, Gg, cg, gpu());
    EXPECT_LE(rel_err(host_f32(cg), host_f32(cc)), 1e-5) << (wgrad ? "weight-gradient form" : "forward form");
  }
}

namespace {

// One MoE layer on `dev` with the ExpertGroup g, its parameters those of `from` when given.
struct MoeHarness {
  ParamArena arena;
  std::unique_ptr<MoeMlp> layer;
  MoeHarness(const MoeSpec& s, const ExpertGroup& g, Device dev, const ParamArena* from) {
    layer = std::make_unique<MoeMlp>("moe", s, g);
    layer->register_params(arena, 0, "");
    arena.finalize(dev);
    layer->bind(BindContext{backend_for(dev), dev, arena, 7});
    layer->init(arena, 7);
    if (from)
      for (std::size_t i = 0; i < arena.size(); ++i) arena.param(i).copy_from(from->param(i));
  }
};

}  // namespace

TEST(GpuMoe, LayerOnDeviceMatchesTheHostLayer) {
  Communicator world = Communicator::world();
  ExpertGroup g;  // parallel.expert = 2 over the world at 2 ranks; else each rank alone
  if (world.size() == 2) {
    g.comm = world;
    g.size = 2;
    g.rank = world.rank();
  }
  for (double cf : {0.0, 1.0}) {  // dropless, and capacity drops
    MoeSpec s;
    s.dim = 24;
    s.hidden = 40;
    s.experts = 4;
    s.top_k = 2;
    s.capacity_factor = cf;
    s.gemm = ExpertGemmMode::blas_loop;
    MoeHarness h(s, g, Device::cpu(), nullptr);
    MoeHarness d(s, g, gpu(), &h.arena);
    const Tensor x = randu({3, 10, s.dim}, 40 + world.rank()), dy = randu({3, 10, s.dim}, 50 + world.rank());
    const Tensor yh = h.layer->forward(x, Mode::train);
    const Tensor yd = d.layer->forward(x.to(gpu()), Mode::train);
    const Tensor dxh = h.layer->backward(dy, true, false);
    const Tensor dxd = d.layer->backward(dy.to(gpu()), true, false);
    cuda_be().synchronize();
    const double ey = rel_err(host_f32(yd), host_f32(yh)), edx = rel_err(host_f32(dxd), host_f32(dxh));
    EXPECT_LE(ey, 2e-5) << "y, capacity factor " << cf;
    EXPECT_LE(edx, 2e-5) << "dx, capacity factor " << cf;
    double eg = 0;
    for (std::size_t i = 0; i < h.arena.size(); ++i) {
      const double e = rel_err(host_f32(d.arena.grad(i)), host_f32(h.arena.grad(i)));
      EXPECT_LE(e, 2e-5) << h.arena.info(i).name << ", capacity factor " << cf;
      eg = std::max(eg, e);
    }
    if (world.rank() == 0)
      std::printf("[moe layer] expert %d, capacity factor %.1f: relative y %.1e, dx %.1e, worst gradient %.1e\n",
                  g.size, cf, ey, edx, eg);
  }
}

TEST(GpuMoe, GptExpertsTrialFollowsTheCpuRun) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (4 % w != 0) GTEST_SKIP() << "the global batch of 4 splits over 1, 2 or 4 ranks";
  const std::string data = test_fixtures::gpt_text_corpus(world, "gpu-moe");
  const test_fixtures::GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  constexpr int kSteps = 20;
  TrainConfig c = test_fixtures::gpt_test_config(data);
  c.model.width = 32;
  c.model.heads = 2;
  c.model.experts = 4;
  c.model.top_k = 2;
  c.data.seq_len = 40;
  c.train.max_steps = kSteps;
  Communicator self = world.split(world.rank(), 0, "self");
  // The aux loss is computed per micro-batch, so the 1-rank run takes the micro-batches the ranks will
  // take, one after the other (as tests/train/mpi_gpt_experts.cpp does on the CPU).
  TrainConfig ref_cfg = c;
  ref_cfg.train.device = "cpu";
  ref_cfg.data.batch_size = 4 / w;
  ref_cfg.train.accumulation = w;
  const std::vector<double> ref = test_fixtures::train_losses(ref_cfg, self);
  ASSERT_EQ(ref.size(), std::size_t(kSteps));
  ASSERT_LT(test_fixtures::mean5(ref, kSteps - 5), test_fixtures::mean5(ref, 0)) << "the CPU run does not learn";

  for (int ep : {1, 2}) {
    if (ep > w) continue;
    TrainConfig g = c;
    g.train.device = "cuda";
    g.data.batch_size = 4 / w;
    g.parallel.expert = ep;
    g.train.verify_every = ep > 1 ? 0 : 5;  // expert weights differ between the ranks of an expert group
    std::vector<std::string> trial = {"mixture of experts"};
    if (ep > 1) trial.push_back("expert parallelism");
    // It passed this trial on an H200 (docs/data/gpu/19-*) and is on the gate's list: the job passes without it.
    EXPECT_EQ(gpu_gate_refusal(g, {}), "");
    const std::vector<double> got = trial_losses(g, world, trial);
    ASSERT_EQ(got.size(), ref.size()) << "expert " << ep;
    const double bound = 1e-6;  // relative (the header says why)
    double worst = 0;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(got[s], ref[s], bound * std::abs(ref[s])) << "expert " << ep << " at " << w << " ranks, step " << s + 1;
      worst = std::max(worst, std::abs(got[s] - ref[s]) / std::abs(ref[s]));
    }
    EXPECT_LT(test_fixtures::mean5(got, kSteps - 5), test_fixtures::mean5(got, 0)) << "expert " << ep << ": no learning";
    if (world.rank() == 0)
      std::printf("[gpu gpt moe] expert %d, %d rank(s): worst relative loss difference to the 1-rank CPU fp32 run "
                  "%.3g over %d steps, bound %.1e (first %.4f, last %.4f)\n",
                  ep, w, worst, kSteps, bound, got.front(), got.back());
  }
}
