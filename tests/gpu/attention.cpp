// The tiled CUDA attention (kernels/attention.cu, FlashAttention-2's schedule,
// the kernel of every causal AttentionSpec: gpt) against the CPU backend on the
// same inputs, forward and backward: causal against the CPU's tiled kernel,
// non-causal (the kernel called directly) against the CPU's dense one. Shapes
// cover 1 and several heads, head widths below, at and above a warp (5, 16, 64,
// 128, 200: the last needs more than 48 KiB of shared memory) and sequence
// lengths that are not multiples of the 32-token tile (1, 7, 33, 49, 70, 257).
// Bounds (max-norm relative, over dqkv and over each of its q, k, v parts):
// float32 1e-5 (as test_gpu_transformer; the kernels' own code, run on the CPU
// by tests/gpu/emulate/run.sh, is within 8e-7 of attention in double);
// bfloat16 and float16 1e-2 against the CPU's float32 on the same
// 16-bit-valued inputs: P, dS and the outputs are rounded to the 16-bit type
// (bf16's unit roundoff 2^-9 = 2e-3), and the emulation measured up to 4.4e-3
// in bf16 at these shapes (docs/data/gpu_attention_emulated.txt).
// The backward is deterministic (no atomics): two runs agree bitwise.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <tuple>

#include "gpu_test_util.hpp"
#include "ringtrain/cuda/kernels.hpp"
#include "ringtrain/nn/backend.hpp"
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

struct Case {
  int n, heads, hd, t;
};
const Case kCases[] = {{3, 1, 16, 1},  {5, 3, 5, 7},   {2, 1, 64, 33},  {5, 4, 16, 49},
                       {2, 2, 64, 70}, {1, 2, 128, 70}, {1, 1, 200, 45}, {1, 3, 64, 257}};

std::string name(const Case& c) {
  return "N " + std::to_string(c.n) + " H " + std::to_string(c.heads) + " hd " + std::to_string(c.hd) + " T " +
         std::to_string(c.t);
}

}  // namespace

class CudaTiledAttention : public ::testing::TestWithParam<DType> {};

TEST_P(CudaTiledAttention, CausalFollowsTheCpuKernel) {
  const DType dt = GetParam();
  for (const Case& c : kCases) {
    const Shape qs{c.n, c.t, 3 * c.heads * c.hd}, os{c.n, c.t, c.heads * c.hd};
    AttentionSpec s{c.heads, c.hd};
    s.causal = true;  // float32 kernels on both: the layers' way, 16-bit activations passed to it
    Pair qkv = make(qs, 11 + c.t, dt, 2.0f), dout = make(os, 12 + c.t, dt);
    auto kc = cpu().attention(s);
    auto kg = gpu_be().attention(s);
    Tensor oc = Tensor::empty(os), og = dev(os, dt);
    kc->forward(qkv.cpu, oc, rt_test::state_of(*kc));
    kg->forward(qkv.dev, og, rt_test::state_of(*kg));
    EXPECT_LE(rel_err(host_f32(og), host_f32(oc)), bound(dt)) << "causal forward " << name(c);
    Tensor dc = Tensor::empty(qs), dg = dev(qs, dt);
    kc->backward(qkv.cpu, dout.cpu, dc, rt_test::state_of(*kc));
    kg->backward(qkv.dev, dout.dev, dg, rt_test::state_of(*kg));
    const auto got = host_f32(dg), ref = host_f32(dc);
    EXPECT_LE(rel_err(got, ref), bound(dt)) << "causal backward " << name(c);
    // q, k and v gradients each, so that a small one cannot hide behind a large one (not at
    // T = 1: a softmax over one key has zero q and k gradients, rounding noise in both kernels).
    const std::int64_t d = c.heads * c.hd;
    for (int part = 0; part < (c.t > 1 ? 3 : 0); ++part) {
      std::vector<float> g1, r1;
      for (std::int64_t row = 0; row < c.n * c.t; ++row)
        for (std::int64_t k = 0; k < d; ++k) {
          g1.push_back(got[std::size_t(row * 3 * d + part * d + k)]);
          r1.push_back(ref[std::size_t(row * 3 * d + part * d + k)]);
        }
      EXPECT_LE(rel_err(g1, r1), bound(dt)) << "causal backward, " << "qkv"[part] << " part, " << name(c);
    }
    Tensor dg2 = dev(qs, dt);
    kg->backward(qkv.dev, dout.dev, dg2, rt_test::state_of(*kg));
    EXPECT_EQ(rel_err(host_f32(dg2), got), 0.0) << "a second backward is bitwise the same: " << name(c);
  }
}

TEST_P(CudaTiledAttention, NonCausalFollowsTheCpuDenseKernel) {
  const DType dt = GetParam();
  for (const Case& c : kCases) {
    const Shape qs{c.n, c.t, 3 * c.heads * c.hd}, os{c.n, c.t, c.heads * c.hd};
    AttentionSpec s{c.heads, c.hd};
    Pair qkv = make(qs, 21 + c.t, dt, 2.0f), dout = make(os, 22 + c.t, dt);
    auto kc = cpu().attention(s);
    Tensor oc = Tensor::empty(os), dc = Tensor::empty(qs);
    kc->forward(qkv.cpu, oc, rt_test::state_of(*kc));
    kc->backward(qkv.cpu, dout.cpu, dc, rt_test::state_of(*kc));
    Tensor og = dev(os, dt), dg = dev(qs, dt), lse = dev({c.n, c.heads, c.t}, DType::f32);
    Tensor scratch = dev({std::int64_t(cuda::flash_attention_scratch_bytes(c.n, c.t, c.heads))}, DType::u8);
    const float scale = float(1.0 / std::sqrt(double(c.hd)));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cuda::flash_attention_forward(qkv.dev.raw(), og.raw(), static_cast<float*>(lse.raw()), c.n, c.t, c.heads, c.hd, scale, false,
                                  dt, nullptr);
    cuda::flash_attention_backward(qkv.dev.raw(), og.raw(), dout.dev.raw(), static_cast<float*>(lse.raw()), dg.raw(),
                                   scratch.raw(), c.n, c.t, c.heads, c.hd, scale, false, dt, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_LE(rel_err(host_f32(og), host_f32(oc)), bound(dt)) << "forward " << name(c);
    EXPECT_LE(rel_err(host_f32(dg), host_f32(dc)), bound(dt)) << "backward " << name(c);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, CudaTiledAttention, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

// A head width over 256 is refused by name when the kernel is made.
TEST(CudaTiledAttentionErrors, WideHeadsAreRefused) {
  AttentionSpec s{1, 300};
  s.causal = true;
  try {
    gpu_be().attention(s);
    ADD_FAILURE() << "a 300-wide head was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head widths up to 256"), std::string::npos) << e.what();
  }
}
