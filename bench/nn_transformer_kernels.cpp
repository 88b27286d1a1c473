// bench_nn_transformer_kernels: where a vision transformer's training step
// spends its time, per kind of operation, against each one's bound. For one
// block of vit (width D, 4D MLP, H heads, T tokens, batch N) it times, at the
// given thread count (CPU time, median of --iters):
//  - the four Linear shapes' three matmuls (y = x w^T, dx = dy w, dw = dy^T x)
//    through OpenBLAS sgemm, oneDNN matmul in fp32 and oneDNN matmul with bf16
//    inputs and fp32 accumulation, against the measured peak of a large
//    oneDNN matmul of the same type;
//  - the backend's attention core, LayerNorm, GELU and residual add, fp32 and
//    bf16 where the kernel takes bf16, against the FLOP bound of attention's
//    matmuls and the byte bound (measured copy bandwidth) of the rest.
// Multiplied by the model's depth, the rows sum to the blocks' share of a
// step; the data behind docs/data/vit_profile.txt.
//
//   bench_nn_transformer_kernels [--batch 32] [--tokens 49] [--width 512]
//                                [--heads 8] [--threads 1] [--iters 5] [--causal]
// --causal adds the tiled causal attention core (a gpt block's) beside the dense one.
#include <cblas.h>
#include <omp.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <dnnl.hpp>
#include <functional>
#include <vector>

#include "ringtrain/nn/backend.hpp"

using namespace ringtrain;
using dt = dnnl::memory::data_type;

namespace {

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Median CPU seconds of f over iters calls, after one warm-up call.
double time_of(const std::function<void()>& f, int iters) {
  f();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const double c0 = cpu_now();
    f();
    t.push_back(cpu_now() - c0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// One oneDNN matmul C[m,n] = A[m,k] op(B), A and B of type `in`, C float32;
// b_trans: B is stored [n, k] (a Linear's weight).
struct DnnlMatmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul prim;
  dnnl::memory a, b, c;
  DnnlMatmul(std::int64_t m, std::int64_t n, std::int64_t k, bool a_trans, bool b_trans, dt in) {
    using tag = dnnl::memory::format_tag;
    dnnl::memory::desc ad({m, k}, in, a_trans ? tag::ba : tag::ab), bd({k, n}, in, b_trans ? tag::ba : tag::ab),
        cd({m, n}, dt::f32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), eng);
    prim = dnnl::matmul(pd);
    a = dnnl::memory(ad, eng);
    b = dnnl::memory(bd, eng);
    c = dnnl::memory(cd, eng);
    std::memset(a.get_data_handle(), 0, ad.get_size());  // bf16 zero is bits zero as well
    std::memset(b.get_data_handle(), 0, bd.get_size());
  }
  void run() {
    prim.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    strm.wait();
  }
};

struct Row {
  std::string what;
  double ms[3] = {0, 0, 0};  // OpenBLAS / oneDNN fp32 / oneDNN bf16 (matmuls), fp32 / bf16 / - (others)
  double flops = 0, bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"per-kind times of a vit block's kernels against their bounds"};
  std::int64_t n = 32, t = 49, d = 512, heads = 8;
  int threads = 1, iters = 5;
  bool causal = false;
  app.add_flag("--causal", causal, "also time the causal attention core (tiled; bound: the unmasked half's FLOPs)");
  app.add_option("--batch", n);
  app.add_option("--tokens", t);
  app.add_option("--width", d);
  app.add_option("--heads", heads);
  app.add_option("--threads", threads);
  app.add_option("--iters", iters);
  CLI11_PARSE(app, argc, argv);
  omp_set_num_threads(threads);
  Backend& be = backend_for(DeviceKind::cpu);
  std::printf("backend: %s; %d thread(s); oneDNN ISA: %s\n", be.name().c_str(), threads,
              be.bf16_isa().c_str());

  // Peaks: a large matmul of each type; copy bandwidth: a 256 MiB buffer.
  const std::int64_t big = 2048;
  double peak[2];
  for (int i = 0; i < 2; ++i) {
    DnnlMatmul mm(big, big, big, false, true, i == 0 ? dt::f32 : dt::bf16);
    peak[i] = 2.0 * big * big * big / time_of([&] { mm.run(); }, 3) / 1e9;
  }
  std::vector<float> src(std::size_t(64) << 20, 1.f), dst(src.size());
  const double bw = 2.0 * 4 * double(src.size()) /
                    time_of([&] { std::memcpy(dst.data(), src.data(), src.size() * 4); }, 3) / 1e9;
  std::printf("measured peaks: oneDNN matmul %lldx%lldx%lld fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s; copy %.1f GB/s\n\n",
              (long long)big, (long long)big, (long long)big, peak[0], peak[1], bw);

  const std::int64_t rows = n * t, hidden = 4 * d;
  std::vector<Row> out;
  struct Shape3 {
    const char* name;
    std::int64_t in, outf;
  };
  for (Shape3 s : {Shape3{"qkv", d, 3 * d}, Shape3{"proj", d, d}, Shape3{"fc1", d, hidden}, Shape3{"fc2", hidden, d}}) {
    // forward: [rows,in] x [out,in]^T; dx: [rows,out] x [out,in]; dw: [rows,out]^T x [rows,in]
    struct Mm {
      const char* pass;
      std::int64_t m, nn, k;
      bool at, bt;
    };
    for (Mm mm : {Mm{"fwd", rows, s.outf, s.in, false, true}, Mm{"dx", rows, s.in, s.outf, false, false},
                  Mm{"dw", s.outf, s.in, rows, true, false}}) {
      Row r;
      r.what = std::string("Linear ") + s.name + " " + mm.pass;
      r.flops = 2.0 * mm.m * mm.nn * mm.k;
      std::vector<float> a(std::size_t(mm.m * mm.k)), b(std::size_t(mm.k * mm.nn)), c(std::size_t(mm.m * mm.nn));
      r.ms[0] = 1e3 * time_of([&] {
        cblas_sgemm(CblasRowMajor, mm.at ? CblasTrans : CblasNoTrans, mm.bt ? CblasTrans : CblasNoTrans,
                    blasint(mm.m), blasint(mm.nn), blasint(mm.k), 1.f, a.data(), blasint(mm.at ? mm.m : mm.k),
                    b.data(), blasint(mm.bt ? mm.k : mm.nn), 0.f, c.data(), blasint(mm.nn));
      }, iters);
      for (int i = 0; i < 2; ++i) {
        DnnlMatmul dm(mm.m, mm.nn, mm.k, mm.at, mm.bt, i == 0 ? dt::f32 : dt::bf16);
        r.ms[1 + i] = 1e3 * time_of([&] { dm.run(); }, iters);
      }
      out.push_back(r);
    }
  }
  std::printf("%-22s %10s %10s %10s %9s %9s %9s\n", "matmul (per block)", "OpenBLAS", "oneDNN32", "oneDNN16",
              "%pk f32", "%pk f32", "%pk bf16");
  double sum[3] = {0, 0, 0};
  for (auto& r : out) {
    std::printf("%-22s %8.2fms %8.2fms %8.2fms %8.0f%% %8.0f%% %8.0f%%\n", r.what.c_str(), r.ms[0], r.ms[1], r.ms[2],
                100 * r.flops / (r.ms[0] * 1e6) / peak[0], 100 * r.flops / (r.ms[1] * 1e6) / peak[0],
                100 * r.flops / (r.ms[2] * 1e6) / peak[1]);
    for (int i = 0; i < 3; ++i) sum[i] += r.ms[i];
  }
  std::printf("%-22s %8.2fms %8.2fms %8.2fms\n\n", "Linear total", sum[0], sum[1], sum[2]);

  // The backend's kernels, fp32 and bf16 (bf16 where the kernel takes it).
  std::printf("%-22s %10s %10s %12s %12s\n", "kernel (per block)", "fp32", "bf16", "bound fp32", "bound bf16");
  auto report = [&](const char* what, double f32, double b16, double flops, double bytes32) {
    auto bound = [&](double pk, double bytes) {
      return flops > 0 ? 1e3 * flops / (pk * 1e9) : 1e3 * bytes / (bw * 1e9);
    };
    std::printf("%-22s %8.2fms %8.2fms %10.2fms %10.2fms\n", what, f32, b16, bound(peak[0], bytes32),
                bound(peak[1], bytes32 / 2));
  };
  auto tensors = [&](DType dty) {
    struct T {
      Tensor qkv, out, dout, dqkv, x, y, dy, dx, g, b, dg, db, h, hy, hdy, hdx;
    } r;
    r.qkv = Tensor::zeros({n, t, 3 * d}, dty);
    r.dqkv = Tensor::zeros({n, t, 3 * d}, dty);
    r.out = Tensor::zeros({n, t, d}, dty);
    r.dout = Tensor::zeros({n, t, d}, dty);
    r.x = Tensor::zeros({rows, d}, dty);
    r.y = Tensor::zeros({rows, d}, dty);
    r.dy = Tensor::zeros({rows, d}, dty);
    r.dx = Tensor::zeros({rows, d}, dty);
    r.g = Tensor::zeros({d});
    for (std::int64_t i = 0; i < d; ++i) r.g.data<float>()[i] = 1.f;
    r.b = Tensor::zeros({d});
    r.dg = Tensor::zeros({d});
    r.db = Tensor::zeros({d});
    r.h = Tensor::zeros({rows, hidden}, dty);
    r.hy = Tensor::zeros({rows, hidden}, dty);
    r.hdy = Tensor::zeros({rows, hidden}, dty);
    r.hdx = Tensor::zeros({rows, hidden}, dty);
    return r;
  };
  auto f = tensors(DType::f32), h = tensors(DType::bf16);
  AttentionSpec as;
  as.heads = heads;
  as.head_dim = d / heads;
  const double att_flops = 2.0 * 2.0 * n * heads * t * t * (d / heads);
  auto att = [&](auto& z, DType dty, bool bwd, bool causal_core = false) {
    (void)dty;  // kernels are made for float32 parameters and take the activations' type
    AttentionSpec cs = as;
    cs.causal = causal_core;
    auto k = be.attention(cs);
    const KernelStatePtr ks = k->make_state();
    k->forward(z.qkv, z.out, *ks);
    return time_of([&] { bwd ? k->backward(z.qkv, z.dout, z.dqkv, *ks) : k->forward(z.qkv, z.out, *ks); }, iters) * 1e3;
  };
  report("attention core fwd", att(f, DType::f32, false), att(h, DType::bf16, false), att_flops, 0);
  report("attention core bwd", att(f, DType::f32, true), att(h, DType::bf16, true), 2 * att_flops, 0);
  if (causal) {
    report("causal attention fwd", att(f, DType::f32, false, true), att(h, DType::bf16, false, true), att_flops / 2, 0);
    report("causal attention bwd", att(f, DType::f32, true, true), att(h, DType::bf16, true, true), att_flops, 0);
  }
  auto ln = [&](auto& z, DType dty, bool bwd) {
    LayerNormSpec s;
    s.features = d;
    (void)dty;
    auto k = be.layernorm(s);
    const KernelStatePtr ks = k->make_state();
    k->forward(z.x, z.g, z.b, z.y, *ks);
    return time_of([&] { bwd ? k->backward(z.x, z.g, z.dy, z.dx, z.dg, z.db, false, *ks) : k->forward(z.x, z.g, z.b, z.y, *ks); },
                   iters) * 1e3;
  };
  const double act = 4.0 * rows * d;  // bytes of one fp32 [rows, D] activation
  report("LayerNorm x2 fwd", 2 * ln(f, DType::f32, false), 2 * ln(h, DType::bf16, false), 0, 2 * 2 * act);
  report("LayerNorm x2 bwd", 2 * ln(f, DType::f32, true), 2 * ln(h, DType::bf16, true), 0, 2 * 3 * act);
  auto gelu = [&](auto& z, DType dty, bool bwd) {
    (void)dty;
    auto k = be.eltwise(Eltwise::gelu, DType::f32);
    k->forward(z.h, z.hy);
    return time_of([&] { bwd ? k->backward(z.h, z.hy, z.hdy, z.hdx) : k->forward(z.h, z.hy); }, iters) * 1e3;
  };
  report("GELU fwd", gelu(f, DType::f32, false), gelu(h, DType::bf16, false), 0, 2 * 4 * act);
  report("GELU bwd", gelu(f, DType::f32, true), gelu(h, DType::bf16, true), 0, 3 * 4 * act);
  auto add = [&](auto& z) { return 2 * 1e3 * time_of([&] { be.add(z.x, z.y, z.dx); }, iters); };
  report("residual add x2", add(f), add(h), 0, 2 * 3 * act);
  return 0;
}
