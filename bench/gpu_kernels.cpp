// Achieved bandwidth of ringtrain's own memory-bound CUDA kernels next to the
// device's measured copy bandwidth (cudaMemcpy device-to-device, bytes read +
// bytes written), in one run: the step's gradient operations (scale, unscale
// with the inf check, sum of squares for clipping), casts, the fusion engine's
// batched pack, and the fused optimizers. Each figure counts the fewest bytes
// the operation must move (every input read once, every output written once).
//   bench_gpu_kernels [--mib 256] [--iters 20] [--out results.json]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/cuda/backend.hpp"
#include "ringtrain/cuda/check.hpp"
#include "ringtrain/cuda/context.hpp"
#include "ringtrain/cuda/kernels.hpp"
#include "ringtrain/cuda/memory.hpp"
#include "ringtrain/cuda/optim.hpp"
#include "ringtrain/nn/parameters.hpp"
#include "ringtrain/optim/optimizer.hpp"

using namespace ringtrain;
using json = nlohmann::json;

namespace {

// Median time in ms of `iters` launches of f on stream s, timed with events.
double time_ms(cudaStream_t s, int iters, const std::function<void()>& f) {
  cudaEvent_t a, b;
  RT_CUDA(cudaEventCreate(&a));
  RT_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    RT_CUDA(cudaEventRecord(a, s));
    f();
    RT_CUDA(cudaEventRecord(b, s));
    RT_CUDA(cudaEventSynchronize(b));
    float t = 0;
    RT_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  RT_CUDA(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Tensor random_f32(std::int64_t n, Device dev, std::uint32_t seed) {
  Tensor h = Tensor::empty({n}, DType::f32);
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < n; ++i) h.data<float>()[i] = d(g);
  return h.to(dev);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringtrain's CUDA kernels: achieved bandwidth vs device copy bandwidth"};
  int mib = 256, iters = 20;
  std::string out;
  app.add_option("--mib", mib, "float32 buffer size in MiB")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "timed launches per kernel (median)")->check(CLI::PositiveNumber);
  app.add_option("--out", out, "write results as JSON here");
  CLI11_PARSE(app, argc, argv);
  if (!cuda::available()) {
    std::printf("SKIPPED: no CUDA device\n");
    return 0;
  }
  const Device dev = Device::cuda(0);
  auto& ctx = cuda::backend_context(0);
  cudaStream_t s = ctx.compute();
  const std::int64_t n = std::int64_t{mib} << 18;  // floats
  const double f4 = 4.0 * static_cast<double>(n);
  Tensor x = random_f32(n, dev, 1), y = random_f32(n, dev, 2);
  Tensor half = Tensor::empty({n}, DType::bf16, dev);
  Tensor flag = Tensor::empty({1}, DType::i32, dev), norm = Tensor::empty({1}, DType::f64, dev);
  Tensor scratch = Tensor::empty({static_cast<std::int64_t>(cuda::sum_squares_scratch_bytes())}, DType::u8, dev);

  // The fusion engine's pack: 64 tensors of 1/64 of the buffer each into one.
  const int pieces = 64;
  std::vector<cuda::CopyEntry> table;
  const std::size_t piece = static_cast<std::size_t>(n / pieces) * 4;
  for (int i = 0; i < pieces; ++i)
    table.push_back({static_cast<const char*>(x.raw()) + i * piece, static_cast<char*>(y.raw()) + i * piece, piece});
  Tensor tab = Tensor::empty({static_cast<std::int64_t>(table.size() * sizeof(cuda::CopyEntry))}, DType::u8, dev);
  RT_CUDA(cudaMemcpy(tab.raw(), table.data(), table.size() * sizeof(cuda::CopyEntry), cudaMemcpyHostToDevice));

  struct Row {
    std::string name;
    double bytes;
    std::function<void()> f;
  };
  std::vector<Row> rows = {
      {"memcpy D2D (reference)", 2 * f4,
       [&] { RT_CUDA(cudaMemcpyAsync(y.raw(), x.raw(), static_cast<std::size_t>(f4), cudaMemcpyDeviceToDevice, s)); }},
      {"scale f32 (in place)", 2 * f4, [&] { cuda::scale(y.raw(), n, DType::f32, 0.999, s); }},
      {"unscale + inf check f32", 2 * f4,
       [&] { cuda::unscale_and_check(y.raw(), n, DType::f32, 1.0f, flag.device_data<int>(), s); }},
      {"sum of squares f32", f4,
       [&] { cuda::sum_squares(x.raw(), n, DType::f32, norm.device_data<double>(), false, scratch.raw(), s); }},
      {"cast f32 -> bf16", f4 + f4 / 2, [&] { cuda::cast(half.raw(), DType::bf16, x.raw(), DType::f32, n, s); }},
      {"batched pack (64 tensors)", 2 * f4,
       [&] { cuda::batched_copy(static_cast<const cuda::CopyEntry*>(tab.raw()), pieces, piece * pieces, s); }},
  };

  // The fused optimizers over n elements in 64 parameters, as a model's arena
  // holds them (one launch, a block row per parameter): SGD with momentum
  // reads p, g, m and writes p, m (5 x 4 bytes); Adam(W) reads p, g, m, v and
  // writes p, m, v (7 x 4 bytes).
  ParamArena arena;
  for (int i = 0; i < pieces; ++i) arena.add("w" + std::to_string(i), {n / pieces});
  arena.finalize(dev);
  for (auto [dst, src] : {std::pair{arena.params_flat(), x}, std::pair{arena.grads_flat(), y}})
    RT_CUDA(cudaMemcpy(dst.raw(), src.raw(), std::min(dst.nbytes(), src.nbytes()), cudaMemcpyDeviceToDevice));
  OptimizerConfig sgd;
  sgd.name = "sgd";
  sgd.momentum = 0.9;
  OptimizerConfig adam;
  adam.name = "adamw";
  cuda::DeviceOptimizer opt_sgd(arena, sgd, ctx), opt_adam(arena, adam, ctx);
  rows.push_back({"SGD momentum step", 5 * f4, [&] { opt_sgd.step(1e-6); }});
  rows.push_back({"AdamW step", 7 * f4, [&] { opt_adam.step(1e-6); }});

  json results = json::array();
  double copy_gbs = 0;
  std::printf("# %d MiB float32 buffers, %s\n", mib, ctx.props().name);
  std::printf("%-26s %10s %10s %12s\n", "kernel", "ms", "GB/s", "vs memcpy");
  for (auto& r : rows) {
    double ms = time_ms(s, iters, r.f);
    double gbs = r.bytes / (ms * 1e-3) / 1e9;
    if (copy_gbs == 0) copy_gbs = gbs;
    std::printf("%-26s %10.3f %10.1f %12.2f\n", r.name.c_str(), ms, gbs, gbs / copy_gbs);
    results.push_back({{"kernel", r.name}, {"median_ms", ms}, {"bytes", r.bytes}, {"gb_s", gbs},
                       {"vs_memcpy", gbs / copy_gbs}});
  }
  if (!out.empty()) std::ofstream(out) << results.dump(2) << "\n";
  return 0;
}
