// Every CUDA backend kernel against the CPU backend on the same random inputs,
// forward and backward, with the bounds: fp32 <= 1e-5 (strict fp32:
// cuDNN FMA math, cuBLAS 32F), bf16 <= 1e-2 relative (inputs rounded to bf16
// for both; the CPU computes in fp32 on the rounded values).
#include "gpu_test_util.hpp"
#include "ringtrain/nn/backend.hpp"
#include "support/kernel_state.hpp"

using namespace ringtrain;
using namespace rt_gpu;

namespace {

Backend& cpu() { return backend_for(DeviceKind::cpu); }
Backend& gpu_be() { return backend_for(DeviceKind::cuda); }

double bound(DType dt) { return dt == DType::f32 ? 1e-5 : 1e-2; }

// x on the GPU in dtype dt; the CPU reference gets the same (rounded) values in f32.
struct Pair {
  Tensor cpu, dev;
};
Pair make(const Shape& s, std::uint32_t seed, DType dt, float a = 1.0f) {
  Tensor h = randu(s, seed, a);
  Tensor low = host_cast(h, dt);
  Tensor back = Tensor::empty(s, DType::f32);
  auto v = host_f32(low);
  std::memcpy(back.raw(), v.data(), v.size() * 4);
  return {back, low.to(gpu())};
}
Tensor dev_empty(const Shape& s, DType dt) { return Tensor::empty(s, dt, gpu()); }
Tensor dev_zeros(const Shape& s, DType dt) { return Tensor::zeros(s, dt, gpu()); }
Tensor none;

}  // namespace

class CudaBackendTest : public ::testing::TestWithParam<DType> {};

TEST_P(CudaBackendTest, Conv2dForwardBackward) {
  const DType dt = GetParam();
  for (bool relu : {false, true}) {
    Conv2dSpec s;
    s.in_channels = 3;
    s.out_channels = 8;
    s.kernel_h = s.kernel_w = 3;
    s.pad_h = s.pad_w = 1;
    s.stride_h = s.stride_w = 2;
    s.fuse_relu = relu;
    Conv2dSpec sc = s;
    s.dtype = dt;
    const Shape xs{4, 3, 11, 9}, ws{8, 3, 3, 3}, ys{4, 8, 6, 5};
    Pair x = make(xs, 1, dt), w = make(ws, 2, dt, 0.5f), b = make({8}, 3, dt), dy = make(ys, 4, dt);
    auto kc = cpu().conv2d(sc);
    auto kg = gpu_be().conv2d(s);
    Tensor yc = Tensor::empty(ys), yg = dev_empty(ys, dt);
    kc->forward(x.cpu, w.cpu, b.cpu, yc, rt_test::state_of(*kc));
    kg->forward(x.dev, w.dev, b.dev, yg, rt_test::state_of(*kg));
    EXPECT_LE(rel_err(host_f32(yg), host_f32(yc)), bound(dt)) << "conv forward relu=" << relu;
    Tensor dxc = Tensor::empty(xs), dwc = Tensor::empty(ws), dbc = Tensor::empty({8});
    Tensor dxg = dev_empty(xs, dt), dwg = dev_empty(ws, dt), dbg = dev_empty({8}, dt);
    kc->backward(x.cpu, w.cpu, yc, dy.cpu, dxc, dwc, dbc, false, rt_test::state_of(*kc));
    kg->backward(x.dev, w.dev, yg, dy.dev, dxg, dwg, dbg, false, rt_test::state_of(*kg));
    EXPECT_LE(rel_err(host_f32(dxg), host_f32(dxc)), bound(dt)) << "conv dx relu=" << relu;
    EXPECT_LE(rel_err(host_f32(dwg), host_f32(dwc)), bound(dt)) << "conv dw relu=" << relu;
    EXPECT_LE(rel_err(host_f32(dbg), host_f32(dbc)), bound(dt)) << "conv db relu=" << relu;
    // accumulate = true adds: twice the gradient.
    kg->backward(x.dev, w.dev, yg, dy.dev, dxg, dwg, dbg, true, rt_test::state_of(*kg));
    auto twice = host_f32(dwc);
    for (auto& v : twice) v *= 2;
    EXPECT_LE(rel_err(host_f32(dwg), twice), bound(dt)) << "conv dw accumulate";
  }
  // A wrong channel count is an Error naming the shape.
  Conv2dSpec s;
  s.in_channels = 5;
  s.out_channels = 2;
  s.dtype = dt;
  auto k = gpu_be().conv2d(s);
  Tensor x = dev_zeros({1, 3, 8, 8}, dt), w = dev_zeros({2, 5, 3, 3}, dt), y = dev_zeros({1, 2, 6, 6}, dt);
  EXPECT_THROW(k->forward(x, w, none, y, rt_test::state_of(*k)), Error);
}

TEST_P(CudaBackendTest, LinearForwardBackward) {
  const DType dt = GetParam();
  for (bool relu : {false, true}) {
    LinearSpec s;
    s.in_features = 37;
    s.out_features = 19;
    s.fuse_relu = relu;
    LinearSpec sc = s;
    s.dtype = dt;
    Pair x = make({13, 37}, 5, dt), w = make({19, 37}, 6, dt, 0.3f), b = make({19}, 7, dt), dy = make({13, 19}, 8, dt);
    auto kc = cpu().linear(sc);
    auto kg = gpu_be().linear(s);
    Tensor yc = Tensor::empty({13, 19}), yg = dev_empty({13, 19}, dt);
    kc->forward(x.cpu, w.cpu, b.cpu, yc);
    kg->forward(x.dev, w.dev, b.dev, yg);
    EXPECT_LE(rel_err(host_f32(yg), host_f32(yc)), bound(dt)) << "linear forward";
    Tensor dxc = Tensor::empty({13, 37}), dwc = Tensor::empty({19, 37}), dbc = Tensor::empty({19});
    Tensor dxg = dev_empty({13, 37}, dt), dwg = dev_empty({19, 37}, dt), dbg = dev_empty({19}, dt);
    kc->backward(x.cpu, w.cpu, yc, dy.cpu, dxc, dwc, dbc, false);
    kg->backward(x.dev, w.dev, yg, dy.dev, dxg, dwg, dbg, false);
    EXPECT_LE(rel_err(host_f32(dxg), host_f32(dxc)), bound(dt)) << "linear dx";
    EXPECT_LE(rel_err(host_f32(dwg), host_f32(dwc)), bound(dt)) << "linear dw";
    EXPECT_LE(rel_err(host_f32(dbg), host_f32(dbc)), bound(dt)) << "linear db";
  }
}

TEST_P(CudaBackendTest, BatchNormTrainAndEval) {
  const DType dt = GetParam();
  BatchNormSpec s;
  s.channels = 6;
  BatchNormSpec sc = s;
  s.dtype = dt;
  const Shape xs{5, 6, 7, 3};
  Pair x = make(xs, 9, dt, 2.0f), dy = make(xs, 10, dt);
  Tensor g = randu({6}, 11), be = randu({6}, 12);
  auto kc = cpu().batchnorm(sc);
  auto kg = gpu_be().batchnorm(s);
  Tensor rmc = Tensor::zeros({6}), rvc = Tensor::zeros({6});
  rvc.fill_(1.0);
  Tensor rmg = rmc.to(gpu()), rvg = rvc.to(gpu()), gg = g.to(gpu()), bg = be.to(gpu());
  Tensor yc = Tensor::empty(xs), yg = dev_empty(xs, dt);
  kc->forward(x.cpu, g, be, rmc, rvc, true, yc, rt_test::state_of(*kc));
  kg->forward(x.dev, gg, bg, rmg, rvg, true, yg, rt_test::state_of(*kg));
  EXPECT_LE(rel_err(host_f32(yg), host_f32(yc)), bound(dt)) << "bn forward";
  EXPECT_LE(rel_err(host_f32(rmg), host_f32(rmc)), 1e-5) << "running mean";
  EXPECT_LE(rel_err(host_f32(rvg), host_f32(rvc)), 1e-5) << "running var (unbiased)";
  Tensor dxc = Tensor::empty(xs), dgc = Tensor::empty({6}), dbc = Tensor::empty({6});
  Tensor dxg = dev_empty(xs, dt), dgg = dev_empty({6}, DType::f32), dbg = dev_empty({6}, DType::f32);
  kc->backward(x.cpu, g, dy.cpu, dxc, dgc, dbc, false, rt_test::state_of(*kc));
  kg->backward(x.dev, gg, dy.dev, dxg, dgg, dbg, false, rt_test::state_of(*kg));
  EXPECT_LE(rel_err(host_f32(dxg), host_f32(dxc)), bound(dt)) << "bn dx";
  EXPECT_LE(rel_err(host_f32(dgg), host_f32(dgc)), bound(dt)) << "bn dgamma";
  EXPECT_LE(rel_err(host_f32(dbg), host_f32(dbc)), bound(dt)) << "bn dbeta";
  kc->forward(x.cpu, g, be, rmc, rvc, false, yc, rt_test::state_of(*kc));
  kg->forward(x.dev, gg, bg, rmg, rvg, false, yg, rt_test::state_of(*kg));
  EXPECT_LE(rel_err(host_f32(yg), host_f32(yc)), bound(dt)) << "bn eval forward";
}

TEST_P(CudaBackendTest, PoolingMaxAndAvg) {
  const DType dt = GetParam();
  for (PoolKind kind : {PoolKind::max, PoolKind::avg}) {
    Pool2dSpec s;
    s.kind = kind;
    s.kernel_h = s.kernel_w = 3;
    s.stride_h = s.stride_w = 2;
    s.pad_h = s.pad_w = 1;
    Pool2dSpec sc = s;
    s.dtype = dt;
    const Shape xs{2, 4, 9, 8}, ys{2, 4, 5, 4};
    Pair x = make(xs, 13, dt), dy = make(ys, 14, dt);
    auto kc = cpu().pool2d(sc);
    auto kg = gpu_be().pool2d(s);
    Tensor yc = Tensor::empty(ys), yg = dev_empty(ys, dt);
    kc->forward(x.cpu, yc, true, rt_test::state_of(*kc));
    kg->forward(x.dev, yg, true, rt_test::state_of(*kg));
    EXPECT_LE(rel_err(host_f32(yg), host_f32(yc)), bound(dt)) << "pool forward";
    Tensor dxc = Tensor::empty(xs), dxg = dev_empty(xs, dt);
    kc->backward(x.cpu, yc, dy.cpu, dxc, rt_test::state_of(*kc));
    kg->backward(x.dev, yg, dy.dev, dxg, rt_test::state_of(*kg));
    EXPECT_LE(rel_err(host_f32(dxg), host_f32(dxc)), bound(dt)) << "pool backward";
  }
}

TEST_P(CudaBackendTest, EltwiseDropoutAddAxpy) {
  const DType dt = GetParam();
  const Shape s{3, 1000};
  Pair x = make(s, 15, dt, 3.0f), dy = make(s, 16, dt);
  for (Eltwise op : {Eltwise::relu, Eltwise::gelu, Eltwise::gelu_tanh}) {  // gelu_tanh: written, not yet run on a GPU
    auto kc = cpu().eltwise(op, DType::f32);
    auto kg = gpu_be().eltwise(op, dt);
    Tensor yc = Tensor::empty(s), yg = dev_empty(s, dt), dxc = Tensor::empty(s), dxg = dev_empty(s, dt);
    kc->forward(x.cpu, yc);
    kg->forward(x.dev, yg);
    kc->backward(x.cpu, yc, dy.cpu, dxc);
    kg->backward(x.dev, yg, dy.dev, dxg);
    EXPECT_LE(rel_err(host_f32(yg), host_f32(yc)), bound(dt)) << "eltwise forward, op " << int(op);
    EXPECT_LE(rel_err(host_f32(dxg), host_f32(dxc)), bound(dt)) << "eltwise backward, op " << int(op);
  }
  Tensor mc = Tensor::empty(s, DType::u8), mg = dev_empty(s, DType::u8);
  Tensor yc = Tensor::empty(s), yg = dev_empty(s, dt);
  cpu().dropout_forward(x.cpu, 0.25, 77, 3, 1000, mc, yc);
  gpu_be().dropout_forward(x.dev, 0.25, 77, 3, 1000, mg, yg);
  Tensor mgh = mg.to(Device::cpu());
  EXPECT_EQ(0, std::memcmp(mgh.raw(), mc.raw(), mc.nbytes())) << "dropout masks differ between CPU and GPU";
  EXPECT_LE(rel_err(host_f32(yg), host_f32(yc)), bound(dt));
  Tensor oc = Tensor::empty(s), og = dev_empty(s, dt);
  cpu().add(x.cpu, dy.cpu, oc);
  gpu_be().add(x.dev, dy.dev, og);
  EXPECT_LE(rel_err(host_f32(og), host_f32(oc)), bound(dt));
  cpu().axpy(-0.5, x.cpu, oc);
  gpu_be().axpy(-0.5, x.dev, og);
  EXPECT_LE(rel_err(host_f32(og), host_f32(oc)), bound(dt) * 2);
}

TEST_P(CudaBackendTest, SoftmaxXentAndAccuracy) {
  const DType dt = GetParam();
  Pair z = make({64, 10}, 17, dt, 3.0f);
  Tensor lab = Tensor::empty({64}, DType::i32);
  for (int i = 0; i < 64; ++i) lab.data<std::int32_t>()[i] = (i * 3) % 10;
  Tensor labg = lab.to(gpu());
  Tensor dc = Tensor::empty({64, 10}), dg = dev_empty({64, 10}, dt);
  double lc = cpu().softmax_xent(z.cpu, lab, 0.1, dc);
  double lg = gpu_be().softmax_xent(z.dev, labg, 0.1, dg);
  EXPECT_NEAR(lg, lc, 1e-5 * std::fabs(lc));
  EXPECT_LE(rel_err(host_f32(dg), host_f32(dc)), bound(dt));
  EXPECT_EQ(gpu_be().count_correct(z.dev, labg), cpu().count_correct(z.cpu, lab));
  lab.data<std::int32_t>()[5] = 10;
  labg = lab.to(gpu());
  EXPECT_THROW(gpu_be().softmax_xent(z.dev, labg, 0.0, dg), Error);
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaBackendTest, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });
