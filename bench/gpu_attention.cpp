// The attention core on the GPU, forward and forward + backward, in one run:
// ringtrain's tiled causal kernel (kernels/attention.cu, gpt's) beside the
// cuBLAS dense kernel at the same shape (vit's: not causal, so it does twice
// the useful work and keeps the [N, H, T, T] probabilities) and PyTorch's
// F.scaled_dot_product_attention(is_causal=True) (its fused FlashAttention
// kernel, bench/reference/torch_attention.py) where the host has PyTorch.
// Figures: median ms over --iters runs (each synchronised), TFLOP/s of the
// causal product work (forward 2 N H T^2 hd, backward twice that: the masked
// half not counted), and each time as a ratio to PyTorch's.
//   bench_gpu_attention [--n 8] [--heads 12] [--tokens 1024] [--head-dim 64]
//                       [--iters 20] [--reference DIR] [--no-torch] [--out results.json]
#include <CLI/CLI.hpp>
#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ringtrain/cuda/check.hpp"
#include "ringtrain/cuda/context.hpp"
#include "ringtrain/nn/backend.hpp"

using namespace ringtrain;
using json = nlohmann::json;

namespace {

double median_ms(Backend& be, int iters, const std::function<void()>& f) {
  for (int i = 0; i < 3; ++i) f();  // warm-up (scratch, cuBLAS plans)
  be.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    be.synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Tensor random_on(const Shape& s, DType dt, Backend& be, std::uint32_t seed) {
  Tensor h = Tensor::empty(s, DType::f32);
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  for (std::int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = d(g);
  Tensor f = h.to(Device::cuda(0));
  if (dt == DType::f32) return f;
  Tensor o = Tensor::empty(s, dt, Device::cuda(0));
  be.cast(f, o);
  return o;
}

json torch_ref(const std::string& ref, std::int64_t n, std::int64_t h, std::int64_t t, std::int64_t hd,
               const char* dtype, int iters) {
  std::ostringstream cmd;
  cmd << "python3 " << ref << "/torch_attention.py --n " << n << " --heads " << h << " --tokens " << t
      << " --head-dim " << hd << " --dtype " << dtype << " --iters " << iters << " 2>&1";
  FILE* p = popen(cmd.str().c_str(), "r");
  if (!p) return {{"error", "popen failed"}};
  std::string out, last;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) {
    out += buf;
    if (buf[0] == '{') last = buf;
  }
  const int rc = pclose(p);
  if (last.empty()) return {{"error", "no JSON from PyTorch (rc " + std::to_string(rc) + "): " + out.substr(0, 300)}};
  try {
    return json::parse(last);
  } catch (const std::exception& e) {
    return {{"error", std::string("bad JSON from PyTorch: ") + e.what()}};
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringtrain's attention core on the GPU vs cuBLAS dense and PyTorch SDPA"};
  std::int64_t n = 8, heads = 12, tokens = 1024, hd = 64;
  int iters = 20;
  std::string ref, out;
  bool no_torch = false;
  app.add_option("--n", n, "samples")->check(CLI::PositiveNumber);
  app.add_option("--heads", heads, "heads")->check(CLI::PositiveNumber);
  app.add_option("--tokens", tokens, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--head-dim", hd, "head width (<= 256)")->check(CLI::Range(1, 256));
  app.add_option("--iters", iters, "timed runs")->check(CLI::PositiveNumber);
  app.add_option("--reference", ref, "directory of torch_attention.py (default: $RINGTRAIN_SOURCE_DIR/bench/reference)");
  app.add_flag("--no-torch", no_torch, "skip the PyTorch reference");
  app.add_option("--out", out, "write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  if (ref.empty()) {
    const char* src = std::getenv("RINGTRAIN_SOURCE_DIR");
    ref = std::string(src ? src : ".") + "/bench/reference";
  }
  if (!cuda::available()) {
    std::printf("SKIPPED: no CUDA device\n");
    return 0;  // not a failure: nothing to measure here (as bench_gpu_train_step)
  }
  Backend& be = backend_for(DeviceKind::cuda);
  cudaDeviceProp prop{};
  RT_CUDA(cudaGetDeviceProperties(&prop, 0));
  const double causal_flops = 2.0 * double(n * heads) * double(tokens) * double(tokens) * double(hd);
  const Shape qs{n, tokens, 3 * heads * hd}, os{n, tokens, heads * hd};
  std::printf("attention core, N %lld H %lld T %lld hd %lld on %s; TFLOP/s of the causal work (fwd %.3g GFLOP, "
              "fwd+bwd 3x)\n",
              (long long)n, (long long)heads, (long long)tokens, (long long)hd, prop.name, causal_flops / 1e9);
  std::printf("%-6s %-28s %10s %12s %10s %10s %12s\n", "dtype", "kernel", "fwd ms", "fwd+bwd ms", "fwd TF/s",
              "f+b TF/s", "f+b / torch");
  json res = {{"gpu", prop.name}, {"n", n}, {"heads", heads}, {"tokens", tokens}, {"head_dim", hd}};
  for (DType dt : {DType::f32, DType::bf16}) {
    const char* dn = dt == DType::f32 ? "fp32" : "bf16";
    Tensor qkv = random_on(qs, dt, be, 1), dout = random_on(os, dt, be, 2);
    Tensor o = Tensor::empty(os, dt, Device::cuda(0)), dqkv = Tensor::empty(qs, dt, Device::cuda(0));
    json t = no_torch ? json{{"error", "--no-torch"}} : torch_ref(ref, n, heads, tokens, hd, dn, iters);
    const double torch_fb = t.contains("forward_backward_ms") ? t["forward_backward_ms"].get<double>() : 0;
    auto row = [&](const char* name, double f, double fb) {
      std::printf("%-6s %-28s %10.3f %12.3f %10.2f %10.2f %12s\n", dn, name, f, fb, causal_flops / f / 1e9,
                  3 * causal_flops / fb / 1e9, torch_fb > 0 ? std::to_string(fb / torch_fb).substr(0, 6).c_str() : "-");
      res[dn][name] = {{"forward_ms", f}, {"forward_backward_ms", fb}, {"vs_torch", torch_fb > 0 ? fb / torch_fb : 0}};
    };
    for (bool causal : {true, false}) {
      AttentionSpec s{heads, hd};
      s.causal = causal;
      auto k = be.attention(s);
      KernelStatePtr st = k->make_state();
      const double f = median_ms(be, iters, [&] { k->forward(qkv, o, *st); });
      const double fb = median_ms(be, iters, [&] {
        k->forward(qkv, o, *st);
        k->backward(qkv, dout, dqkv, *st);
      });
      row(causal ? "ringtrain tiled causal" : "ringtrain cuBLAS dense (T^2)", f, fb);
    }
    if (t.contains("forward_ms")) {
      std::printf("%-6s %-28s %10.3f %12.3f %10.2f %10.2f %12s\n", dn, "PyTorch SDPA causal",
                  t["forward_ms"].get<double>(), torch_fb, causal_flops / t["forward_ms"].get<double>() / 1e9,
                  3 * causal_flops / torch_fb / 1e9, "1");
    } else {
      std::printf("%-6s PyTorch: %s\n", dn, t.value("error", std::string("?")).c_str());
    }
    res[dn]["torch"] = t;
  }
  if (!out.empty()) std::ofstream(out) << res.dump(2) << "\n";
  return 0;
}
