// bench_nn_throughput: images/s of one training step (forward + loss +
// backward + plain SGD axpy on the arena) for the model zoo on the CPU, in
// fp32 and bf16 (train.precision), next to PyTorch on the same model, batch
// and thread count in fp32 and under torch.autocast("cpu", torch.bfloat16),
// measured in the same invocation (bench/reference/torch_throughput.py via
// /usr/bin/python3), in alternating rounds so that background load hits both
// alike. Also prints the achieved GFLOP/s of conv/linear math (3x forward
// FLOPs) against the measured peak of a large oneDNN matmul of the same
// precision (the widest vectors and matrix units oneDNN finds).
//
//   bench_nn_throughput [--models cnn,resnet,vit] [--batch 32] [--threads 1]
//                       [--precisions fp32,bf16] [--rounds 3] [--iters 20]
//                       [--warmup 5] [--profile] [--json out.json]
//                       [--csv out.csv] [--no-torch]
#include <omp.h>

#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "measure.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/parallel/stage.hpp"

using namespace ringtrain;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using rt_bench::cpu_now;
using rt_bench::matmul_peak;
using rt_bench::median;

struct Result {
  std::string model, precision;
  double rt_ips = 0, torch_ips = 0, rt_cpu_ips = 0, torch_cpu_ips = 0, gflop_per_image = 0;
  std::vector<double> rt_rounds, torch_rounds, rt_cpu_rounds, torch_cpu_rounds;
};

ModelConfig config_for(const std::string& name, const std::string& precision) {
  ModelConfig c;
  c.name = name;
  c.math = parse_math_mode(precision);
  if (name == "resnet") {  // ResNet-20 on CIFAR-sized input
    c.in_channels = 3;
    c.height = c.width = 32;
  }
  if (name == "vit") {  // the size users train (issue 31): 49 tokens of width 512, 8 heads, 8 blocks, MLP 4x
    c.base_width = 512;
    c.heads = 8;
    c.depth = 8;
    c.mlp_ratio = 4;
    c.patch = 4;
  }
  return c;
}

// Per top-level layer forward/backward times (ms), one step, after warm-up.
void profile(Stage& m, const Tensor& x, const Tensor& y, int iters) {
  std::vector<double> f(static_cast<std::size_t>(m.num_layers()), 0), b = f;
  Tensor dl = Tensor::empty(m.output_shape(x.dim(0)));
  // The stage's boundary casts (bf16 activations), timed as layers of their own.
  const DType act = m.activation_dtype();
  Tensor x16 = Tensor::empty(x.shape(), act), y32 = Tensor::empty(m.output_shape(x.dim(0))), dl16 = Tensor::empty(y32.shape(), act);
  Backend& be = backend_for(DeviceKind::cpu);
  double casts = 0;
  for (int it = 0; it < iters; ++it) {
    double c0 = cpu_now();
    Tensor h = x;
    if (act != DType::f32) be.cast(x, x16), h = x16;
    casts += cpu_now() - c0;
    for (int i = 0; i < m.num_layers(); ++i) {
      double t0 = cpu_now();
      h = m.layer(i).forward(h, Mode::train);
      f[std::size_t(i)] += cpu_now() - t0;
    }
    c0 = cpu_now();
    if (act != DType::f32) be.cast(h, y32), h = y32;
    casts += cpu_now() - c0;
    softmax_cross_entropy(h, y, 0.0, dl);
    Tensor g = dl;
    c0 = cpu_now();
    if (act != DType::f32) be.cast(dl, dl16), g = dl16;
    casts += cpu_now() - c0;
    for (int i = m.num_layers() - 1; i >= 0; --i) {
      double t0 = cpu_now();
      g = m.layer(i).backward(g, i > 0, false);
      b[std::size_t(i)] += cpu_now() - t0;
    }
  }
  std::printf("  per-layer CPU ms (forward / backward), mean of %d steps; boundary casts %.3f ms:\n", iters,
              1e3 * casts / iters);
  for (int i = 0; i < m.num_layers(); ++i)
    std::printf("    %-12s %-14s %8.3f / %8.3f\n", m.layer(i).name().c_str(), m.layer(i).type(),
                1e3 * f[std::size_t(i)] / iters, 1e3 * b[std::size_t(i)] / iters);
}

struct Rate {
  double wall = 0, cpu = 0;  // images/s by wall-clock and by process CPU time (medians of steps)
};

Rate ringtrain_round(Stage& m, const Tensor& x, const Tensor& y, int warmup, int iters, Backend& be) {
  Tensor dl = Tensor::empty(m.output_shape(x.dim(0)));
  Tensor params = m.arena().params_flat(), grads = m.arena().grads_flat();
  std::vector<double> t, c;
  for (int it = 0; it < warmup + iters; ++it) {
    auto t0 = Clock::now();
    double c0 = cpu_now();
    m.zero_grads();
    softmax_cross_entropy(m.forward(0, x, Mode::train), y, 0.0, dl);
    m.backward_input(0, dl, false);  // fused: each layer's whole backward
    be.axpy(-0.01, grads, params);
    m.arena().mark_updated();  // as an optimizer step does: bf16 weight copies are recast
    if (it >= warmup) {
      t.push_back(seconds_since(t0));
      c.push_back(cpu_now() - c0);
    }
  }
  return {double(x.dim(0)) / median(t), double(x.dim(0)) / median(c)};
}

Rate torch_round(const std::string& script, const ModelConfig& c, std::int64_t batch, int threads, int warmup,
                   int iters, bool bf16) {
  std::string cmd = "OMP_NUM_THREADS=" + std::to_string(threads) + " /usr/bin/python3 " + script +
                    " --model " + c.name + " --batch " + std::to_string(batch) + " --threads " +
                    std::to_string(threads) + " --warmup " + std::to_string(warmup) + " --iters " +
                    std::to_string(iters) + " --in-channels " + std::to_string(c.in_channels) + " --size " +
                    std::to_string(c.height) + " --depth " + std::to_string(c.depth) + " --width " +
                    std::to_string(c.base_width) + " --heads " + std::to_string(c.heads) + " --mlp-ratio " +
                    std::to_string(c.mlp_ratio) + " --patch " + std::to_string(c.patch) +
                    (bf16 ? " --autocast bf16" : "");
  const nlohmann::json j = rt_bench::run_json(cmd);
  if (j.is_null()) return {};
  return {j["images_per_s"].get<double>(), j["cpu_images_per_s"].get<double>()};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringtrain CPU training-step throughput vs PyTorch"};
  std::string models = "cnn,resnet,vit", json_path, csv_path;
  std::int64_t batch = 32;
  std::string precisions = "fp32,bf16";
  int threads = 1, rounds = 3, iters = 20, warmup = 5;
  bool no_torch = false, do_profile = false;
  std::string script = (std::filesystem::path(__FILE__).parent_path() / "reference" / "torch_throughput.py").string();
  app.add_option("--models", models, "comma-separated: mlp, cnn, resnet, vit");
  app.add_option("--batch", batch, "images per step");
  app.add_option("--precisions", precisions, "comma-separated train.precision values: fp32, bf16");
  app.add_option("--threads", threads, "OpenMP/OpenBLAS threads (both frameworks)");
  app.add_option("--rounds", rounds, "alternating ringtrain/PyTorch measurement rounds");
  app.add_option("--iters", iters, "timed steps per round (median taken)");
  app.add_option("--warmup", warmup, "untimed steps per round");
  app.add_option("--json", json_path, "write results as JSON");
  app.add_option("--csv", csv_path, "write results as CSV");
  app.add_option("--torch-script", script, "PyTorch reference script");
  app.add_flag("--no-torch", no_torch, "skip the PyTorch reference");
  app.add_flag("--profile", do_profile, "print per-layer forward/backward times");
  CLI11_PARSE(app, argc, argv);

  omp_set_num_threads(threads);  // before the backend exists: it sizes OpenBLAS from this
  Backend& be = backend_for(DeviceKind::cpu);
  const double peak32 = matmul_peak(false), peak16 = matmul_peak(true);
  std::printf("backend: %s; bf16 math on %s\n", be.name().c_str(), be.bf16_isa().c_str());
  std::printf("matmul peak (measured: oneDNN 2048^3, %d thread(s)): fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s\n", threads,
              peak32, peak16);

  std::vector<Result> results;
  std::stringstream ms(models);
  std::vector<std::string> precs;
  {
    std::stringstream ps(precisions);
    for (std::string p; std::getline(ps, p, ',');) precs.push_back(p);
  }
  for (std::string name; std::getline(ms, name, ',');)
  for (const std::string& prec : precs) {
    ModelConfig c = config_for(name, prec);
    const bool bf16 = c.math == MathMode::bf16;
    const double peak = bf16 ? peak16 : peak32;
    // The whole model, its backward fused (no deferred weight half) and
    // overwriting the gradients after zero_grads (no zeroing pass).
    auto m = std::make_unique<Stage>(c, Device::cpu());
    m->set_fused_backward(true);
    std::mt19937_64 g(1);
    std::normal_distribution<float> nd;
    Tensor x = Tensor::empty({batch, c.in_channels, c.height, c.width});
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = nd(g);
    Tensor y = Tensor::empty({batch}, DType::i32);
    for (std::int64_t i = 0; i < batch; ++i) y.data<std::int32_t>()[i] = static_cast<std::int32_t>(g() % 10);
    Result r;
    r.model = name;
    r.precision = prec;
    r.gflop_per_image = model_flops_per_sample(c) / 1e9;
    std::printf("\n%s %s (activations %s): %lld params, batch %lld, %d thread(s), %.1f MFLOP/image per step\n",
                name.c_str(), prec.c_str(), dtype_name(m->activation_dtype()),
                static_cast<long long>(m->arena().numel()), static_cast<long long>(batch), threads,
                r.gflop_per_image * 1e3);
    for (int round = 0; round < rounds; ++round) {
      Rate a = ringtrain_round(*m, x, y, warmup, iters, be);
      r.rt_rounds.push_back(a.wall);
      r.rt_cpu_rounds.push_back(a.cpu);
      std::printf("  round %d: ringtrain %7.1f img/s (CPU time %7.1f)", round, a.wall, a.cpu);
      if (!no_torch) {
        Rate b = torch_round(script, c, batch, threads, warmup, iters, bf16);
        r.torch_rounds.push_back(b.wall);
        r.torch_cpu_rounds.push_back(b.cpu);
        std::printf("   pytorch %7.1f img/s (CPU time %7.1f)", b.wall, b.cpu);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    r.rt_ips = median(r.rt_rounds);
    r.rt_cpu_ips = median(r.rt_cpu_rounds);
    r.torch_ips = no_torch ? 0 : median(r.torch_rounds);
    r.torch_cpu_ips = no_torch ? 0 : median(r.torch_cpu_rounds);
    // Wall-clock rates compare with the peak of all threads' cores; CPU-time
    // rates are per CPU-second, i.e. per core.
    auto line = [&](const char* what, double a, double b, double cores) {
      const double gf = a * r.gflop_per_image;
      std::printf("  %-9s ringtrain %7.1f img/s (%5.1f GFLOP/s = %3.0f%% of peak)", what, a, gf,
                  peak > 0 ? 100 * gf / (peak * cores) : 0);
      if (b > 0)
        std::printf(" | pytorch%s %7.1f img/s (%5.1f GFLOP/s) | ratio %.2fx", bf16 ? " autocast bf16" : "", b,
                    b * r.gflop_per_image, a / b);
      std::printf("\n");
    };
    line("wall:", r.rt_ips, r.torch_ips, threads);
    line("CPU time:", r.rt_cpu_ips, r.torch_cpu_ips, 1);
    if (do_profile) profile(*m, x, y, iters);
    results.push_back(r);
  }

  if (!json_path.empty()) {
    nlohmann::json j = {{"backend", be.name()}, {"bf16_isa", be.bf16_isa()}, {"threads", threads}, {"batch", batch},
                        {"matmul_peak_fp32_gflops", peak32}, {"matmul_peak_bf16_gflops", peak16}};
    for (auto& r : results)
      j["models"].push_back({{"model", r.model},
                             {"precision", r.precision},
                             {"ringtrain_images_per_s", r.rt_ips},
                             {"pytorch_images_per_s", r.torch_ips},
                             {"ratio", r.torch_ips > 0 ? r.rt_ips / r.torch_ips : 0},
                             {"ringtrain_cpu_images_per_s", r.rt_cpu_ips},
                             {"pytorch_cpu_images_per_s", r.torch_cpu_ips},
                             {"cpu_ratio", r.torch_cpu_ips > 0 ? r.rt_cpu_ips / r.torch_cpu_ips : 0},
                             {"gflop_per_image", r.gflop_per_image},
                             {"ringtrain_gflops", r.rt_ips * r.gflop_per_image},
                             {"ringtrain_rounds", r.rt_rounds},
                             {"pytorch_rounds", r.torch_rounds}});
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  if (!csv_path.empty()) {
    std::ofstream f(csv_path);
    f << "model,precision,batch,threads,ringtrain_images_per_s,pytorch_images_per_s,ratio,ringtrain_cpu_images_per_s,"
         "pytorch_cpu_images_per_s,cpu_ratio,ringtrain_gflops,matmul_peak_gflops\n";
    for (auto& r : results)
      f << r.model << "," << r.precision << "," << batch << "," << threads << "," << r.rt_ips << "," << r.torch_ips << ","
        << (r.torch_ips > 0 ? r.rt_ips / r.torch_ips : 0) << "," << r.rt_cpu_ips << "," << r.torch_cpu_ips << ","
        << (r.torch_cpu_ips > 0 ? r.rt_cpu_ips / r.torch_cpu_ips : 0) << "," << r.rt_ips * r.gflop_per_image << ","
        << (r.precision == "bf16" ? peak16 : peak32) << "\n";
  }
  return 0;
}
