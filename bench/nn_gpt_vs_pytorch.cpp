// bench_nn_gpt_vs_pytorch: seconds per training step of the `gpt` model
// (forward, per-token softmax cross-entropy, backward, plain SGD on the arena)
// on one thread, in fp32 and bf16 (train.precision: bfloat16 activations),
// next to PyTorch on the same architecture, shape and thread count
// (bench/reference/torch_gpt_step.py via /usr/bin/python3; bf16 there is
// torch.autocast("cpu", torch.bfloat16)), in alternating rounds so that
// background load hits both alike. Prints step time, tokens/s, the ratio, and
// the model FLOP/s as a fraction of the measured matmul peak of the same
// precision (MFU; model FLOPs = 3x the forward's matmul FLOPs, which is
// 6 N tokens for the N weights that multiply, plus 12 L T d per token of attention).
//
//   bench_nn_gpt_vs_pytorch [--sizes small,124m] [--precisions fp32,bf16]
//       [--rounds 3] [--steps 6] [--warmup 2] [--big-rounds 1] [--big-steps 2]
//       [--big-warmup 1] [--threads 1] [--profile] [--json out.json] [--no-torch]
//
// small: width 256, depth 4, 4 heads, seq 256, batch 8, vocabulary 256 (bytes);
// 124m: GPT-2 small's shape, width 768, depth 12, 12 heads, seq 1024, batch 1,
// vocabulary 50257 (one round by default: PyTorch's fp32 step takes ~50 s there).
// Tokens are synthetic (uniform ids: the shapes are what is timed).
#include <omp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "measure.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/parallel/stage.hpp"

using namespace ringtrain;
using rt_bench::cpu_now;
using rt_bench::median;
using Clock = std::chrono::steady_clock;

namespace {

struct Shape3 {
  std::string name;
  std::int64_t width, depth, heads, seq, batch, vocab;
  int rounds, steps, warmup;
};

struct Time {
  double wall = 0, cpu = 0;  // seconds per step, medians
  std::string info;          // PyTorch: its version and attention
};

ModelConfig config_for(const Shape3& s, const std::string& precision) {
  ModelConfig c;
  c.name = "gpt";
  c.base_width = s.width;
  c.depth = static_cast<int>(s.depth);
  c.heads = static_cast<int>(s.heads);
  c.mlp_ratio = 4;
  c.seq_len = s.seq;
  c.classes = s.vocab;
  c.math = parse_math_mode(precision);
  return c;
}

Time ringtrain_round(Stage& m, const Tensor& x, const Tensor& y, int warmup, int steps, Backend& be) {
  Tensor dl = Tensor::empty(m.output_shape(x.dim(0)));
  Tensor params = m.arena().params_flat(), grads = m.arena().grads_flat();
  std::vector<double> t, c;
  for (int it = 0; it < warmup + steps; ++it) {
    const auto t0 = Clock::now();
    const double c0 = cpu_now();
    m.zero_grads();
    softmax_cross_entropy(m.forward(0, x, Mode::train), y, 0.0, dl);
    m.backward_input(0, dl, false);  // fused: each layer's whole backward
    be.axpy(-0.01, grads, params);
    m.arena().mark_updated();  // as an optimizer step: bf16 weight copies are recast
    if (it >= warmup) {
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      c.push_back(cpu_now() - c0);
    }
  }
  return {median(t), median(c), {}};
}

Time torch_round(const std::string& script, const Shape3& s, int threads, int warmup, int steps, bool bf16) {
  auto n = [](auto v) { return std::to_string(v); };
  const std::string cmd = "OMP_NUM_THREADS=" + n(threads) + " /usr/bin/python3 " + script + " --width " +
                          n(s.width) + " --depth " + n(s.depth) + " --heads " + n(s.heads) + " --seq " + n(s.seq) +
                          " --batch " + n(s.batch) + " --vocab " + n(s.vocab) + " --threads " + n(threads) +
                          " --warmup " + n(warmup) + " --steps " + n(steps) + (bf16 ? " --autocast bf16" : "");
  const nlohmann::json j = rt_bench::run_json(cmd);
  if (j.is_null()) return {};
  return {j["median_s"].get<double>(), j["cpu_median_s"].get<double>(),
          "pytorch " + j["version"].get<std::string>() + ", attention " +
              (j["sdpa"].get<bool>() ? "scaled_dot_product_attention" : "matmul, mask, softmax (no SDPA)")};
}

// Per top-level layer forward/backward CPU ms of one step, and the loss.
void profile(Stage& m, const Tensor& x, const Tensor& y) {
  const DType act = m.activation_dtype();
  Backend& be = backend_for(DeviceKind::cpu);
  std::vector<double> f(static_cast<std::size_t>(m.num_layers()), 0), b = f;
  Tensor h = x;
  for (int i = 0; i < m.num_layers(); ++i) {
    const double t0 = cpu_now();
    h = m.layer(i).forward(h, Mode::train);
    f[std::size_t(i)] = cpu_now() - t0;
  }
  Tensor dl = Tensor::empty(h.shape());
  softmax_cross_entropy(h, y, 0.0, dl);  // once before timing: dl's fresh pages fault in here
  double t0 = cpu_now();
  softmax_cross_entropy(h, y, 0.0, dl);
  const double loss = cpu_now() - t0;
  Tensor g = dl;
  if (act != DType::f32 && g.dtype() != act) {
    Tensor g16 = Tensor::empty(g.shape(), act);
    be.cast(g, g16);
    g = g16;
  }
  for (int i = m.num_layers() - 1; i >= 0; --i) {
    t0 = cpu_now();
    g = m.layer(i).backward(g, i > 0, false);
    b[std::size_t(i)] = cpu_now() - t0;
  }
  std::printf("  per-layer CPU ms (forward / backward), one step; loss %.1f ms:\n", 1e3 * loss);
  for (int i = 0; i < m.num_layers(); ++i)
    std::printf("    %-12s %-24s %9.1f / %9.1f\n", m.layer(i).name().c_str(), m.layer(i).type(), 1e3 * f[std::size_t(i)],
                1e3 * b[std::size_t(i)]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringtrain gpt training step vs PyTorch, one thread"};
  std::string sizes = "small,124m", precisions = "fp32,bf16", json_path;
  int threads = 1, rounds = 3, steps = 6, warmup = 2, big_rounds = 1, big_steps = 2, big_warmup = 1;
  bool no_torch = false, do_profile = false;
  std::string script = (std::filesystem::path(__FILE__).parent_path() / "reference" / "torch_gpt_step.py").string();
  app.add_option("--sizes", sizes, "comma-separated: small, 124m");
  app.add_option("--precisions", precisions, "comma-separated train.precision values: fp32, bf16");
  app.add_option("--threads", threads, "OpenMP threads (both frameworks)");
  app.add_option("--rounds", rounds, "small: alternating ringtrain/PyTorch rounds");
  app.add_option("--steps", steps, "small: timed steps per round (median taken)");
  app.add_option("--warmup", warmup, "small: untimed steps per round");
  app.add_option("--big-rounds", big_rounds, "124m: alternating rounds");
  app.add_option("--big-steps", big_steps, "124m: timed steps per round");
  app.add_option("--big-warmup", big_warmup, "124m: untimed steps per round");
  app.add_option("--json", json_path, "write the results as JSON");
  app.add_option("--torch-script", script, "PyTorch reference script");
  app.add_flag("--no-torch", no_torch, "skip the PyTorch reference");
  app.add_flag("--profile", do_profile, "print per-layer forward/backward times (one extra step)");
  CLI11_PARSE(app, argc, argv);
  // __FILE__ may be relative to the build directory of the bench: resolve it from the binary's.
  if (std::filesystem::path(script).is_relative() && !std::filesystem::exists(script))
    script = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / script).lexically_normal().string();

  omp_set_num_threads(threads);  // before the backend exists: it sizes OpenBLAS from this
  Backend& be = backend_for(DeviceKind::cpu);
  const double peak32 = rt_bench::matmul_peak(false), peak16 = rt_bench::matmul_peak(true);
  std::printf("backend: %s; bf16 math on %s\n", be.name().c_str(), be.bf16_isa().c_str());
  std::printf("matmul peak (measured: oneDNN 2048^3, %d thread(s), best of 4 by CPU time): fp32 %.1f GFLOP/s, "
              "bf16 %.1f GFLOP/s\n", threads, peak32, peak16);

  const std::vector<Shape3> known = {{"small", 256, 4, 4, 256, 8, 256, rounds, steps, warmup},
                                     {"124m", 768, 12, 12, 1024, 1, 50257, big_rounds, big_steps, big_warmup}};
  auto split = [](const std::string& s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    for (std::string p; std::getline(ss, p, ',');) v.push_back(p);
    return v;
  };
  nlohmann::json out = {{"backend", be.name()},       {"bf16_isa", be.bf16_isa()},
                        {"threads", threads},         {"matmul_peak_fp32_gflops", peak32},
                        {"matmul_peak_bf16_gflops", peak16}};
  for (const std::string& name : split(sizes)) {
    auto it = std::find_if(known.begin(), known.end(), [&](const Shape3& s) { return s.name == name; });
    if (it == known.end()) {
      std::fprintf(stderr, "--sizes: unknown size '%s' (known: small, 124m)\n", name.c_str());
      return 2;
    }
    const Shape3& s = *it;
    for (const std::string& prec : split(precisions)) {
      const ModelConfig c = config_for(s, prec);
      const bool bf16 = c.math == MathMode::bf16;
      const double peak = bf16 ? peak16 : peak32;
      auto m = std::make_unique<Stage>(c, Device::cpu());
      m->set_fused_backward(true);
      std::mt19937_64 g(1);
      Tensor x = Tensor::empty({s.batch, s.seq}), y = Tensor::empty({s.batch, s.seq}, DType::i32);
      for (std::int64_t i = 0; i < x.numel(); ++i) {
        x.data<float>()[i] = float(g() % std::uint64_t(s.vocab));
        y.data<std::int32_t>()[i] = std::int32_t(g() % std::uint64_t(s.vocab));
      }
      const double tokens = double(s.batch * s.seq), flops = model_flops_per_sample(c) * double(s.batch);
      std::printf("\n%s %s (activations %s): %lld params, width %lld, depth %lld, %lld heads, seq %lld, batch %lld, "
                  "vocabulary %lld; %.1f GFLOP per step\n", s.name.c_str(), prec.c_str(),
                  dtype_name(m->activation_dtype()), static_cast<long long>(m->arena().numel()),
                  static_cast<long long>(s.width), static_cast<long long>(s.depth), static_cast<long long>(s.heads),
                  static_cast<long long>(s.seq), static_cast<long long>(s.batch), static_cast<long long>(s.vocab),
                  flops / 1e9);
      std::vector<double> rt_w, rt_c, pt_w, pt_c;
      std::string torch_info;
      for (int r = 0; r < s.rounds; ++r) {
        const Time a = ringtrain_round(*m, x, y, s.warmup, s.steps, be);
        rt_w.push_back(a.wall), rt_c.push_back(a.cpu);
        std::printf("  round %d: ringtrain %8.3f s/step (CPU %8.3f)", r, a.wall, a.cpu);
        if (!no_torch) {
          const Time b = torch_round(script, s, threads, s.warmup, s.steps, bf16);
          pt_w.push_back(b.wall), pt_c.push_back(b.cpu);
          std::printf("   pytorch %8.3f s/step (CPU %8.3f)", b.wall, b.cpu);
          if (!b.info.empty()) torch_info = b.info;
        }
        std::printf("\n");
        std::fflush(stdout);
      }
      const double rw = median(rt_w), rc = median(rt_c), pw = median(pt_w), pc = median(pt_c);
      auto line = [&](const char* what, double rt, double pt) {
        std::printf("  %-9s ringtrain %8.3f s/step %9.0f tokens/s MFU %5.1f%%", what, rt, tokens / rt,
                    100 * flops / rt / (peak * 1e9));
        if (pt > 0)
          std::printf(" | pytorch%s %8.3f s/step %9.0f tokens/s MFU %5.1f%% | ratio %.2fx", bf16 ? " autocast" : "",
                      pt, tokens / pt, 100 * flops / pt / (peak * 1e9), pt / rt);
        std::printf("\n");
      };
      if (!torch_info.empty()) std::printf("  %s\n", torch_info.c_str());
      std::printf("  MFU against the %s matmul peak %.1f GFLOP/s (goal: ratio >= 1.3x)\n", bf16 ? "bf16" : "fp32",
                  peak);
      line("wall:", rw, pw);
      line("CPU time:", rc, pc);
      if (do_profile) profile(*m, x, y);
      out["runs"].push_back({{"size", s.name},
                             {"precision", prec},
                             {"params", m->arena().numel()},
                             {"tokens_per_step", tokens},
                             {"model_flops_per_step", flops},
                             {"matmul_peak_gflops", peak},
                             {"ringtrain_s", rw},
                             {"ringtrain_cpu_s", rc},
                             {"pytorch_s", pw},
                             {"pytorch_cpu_s", pc},
                             {"ratio", rw > 0 && pw > 0 ? pw / rw : 0},
                             {"cpu_ratio", rc > 0 && pc > 0 ? pc / rc : 0},
                             {"ringtrain_mfu", flops / rw / (peak * 1e9)},
                             {"ringtrain_rounds_s", rt_w},
                             {"pytorch_rounds_s", pt_w},
                             {"ringtrain_rounds_cpu_s", rt_c},
                             {"pytorch_rounds_cpu_s", pt_c}});
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
