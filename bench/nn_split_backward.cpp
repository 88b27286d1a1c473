// What a zero-bubble schedule's split backward costs per layer: each top-level
// layer's whole backward (B, the fused kernels 1F1B runs) against its input
// half I and weight half W run apart (every I of the stage, then every W: the
// order a zero-bubble pipeline leaves them in) and run adjacent (I, then the
// same layer's W at once). apart/B above adjacent/B is the price of the
// distance (x and dy read again, colder); adjacent/B above 1 is what the split
// itself recomputes. The bench shapes of bench/pipeline_schedules.sh: vit
// (width 64, 4 blocks, micro-batch 64 images) and gpt (width 128, 4 blocks,
// micro-batch 8 x 128 tokens), and vit-parts: one vit block's sub-layers as
// top-level layers, so that "adjacent" is per Linear (each I followed by its own
// W, as the whole backward runs them) rather than per block. Process CPU time,
// medians; run at one thread:
//   OMP_NUM_THREADS=1 build/bench/bench_nn_split_backward [--iters 30] [--models "vit gpt vit-parts"]
#include <omp.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>

#include "measure.hpp"
#include "ringtrain/nn/layers.hpp"
#include "ringtrain/parallel/stage.hpp"

using namespace ringtrain;
using rt_bench::cpu_now;
using rt_bench::median;

namespace {

struct Case {
  ModelConfig mc;
  Tensor x;
};

Case make_case(const std::string& name) {
  Case c;
  std::mt19937_64 g(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  if (name == "vit") {
    c.mc.name = "vit";
    c.mc.base_width = 64;
    c.mc.heads = 4;
    c.mc.depth = 4;
    c.mc.mlp_ratio = 2.0;
    c.mc.patch = 4;
    c.x = Tensor::empty({64, 1, 28, 28});
    for (std::int64_t i = 0; i < c.x.numel(); ++i) c.x.data<float>()[i] = u(g);
  } else if (name == "gpt") {
    c.mc.name = "gpt";
    c.mc.base_width = 128;
    c.mc.heads = 4;
    c.mc.depth = 4;
    c.mc.mlp_ratio = 4.0;
    c.mc.seq_len = 128;
    c.mc.classes = 256;
    c.x = Tensor::empty({8, 128});
    for (std::int64_t i = 0; i < c.x.numel(); ++i) c.x.data<float>()[i] = float(g() % 256);
  } else if (name == "vit-parts") {  // one vit block's sub-layers as top-level layers (no residual sums)
    auto d = [](const char* type, std::vector<std::pair<std::string, LayerDesc::Value>> o = {}) {
      return LayerDesc{type, std::move(o), {}, {}};
    };
    c.mc.name = "layers";
    c.mc.layers = {d("patch_embed", {{"out", std::int64_t(64)}, {"patch", std::int64_t(4)}}),
                   d("layernorm"),
                   d("attention", {{"heads", std::int64_t(4)}}),
                   d("layernorm"),
                   d("linear", {{"out", std::int64_t(128)}}),
                   d("gelu"),
                   d("linear", {{"out", std::int64_t(64)}}),
                   d("token_mean"),
                   d("linear", {{"out", std::int64_t(10)}})};
    c.x = Tensor::empty({64, 1, 28, 28});
    for (std::int64_t i = 0; i < c.x.numel(); ++i) c.x.data<float>()[i] = u(g);
  } else {
    throw std::runtime_error("--models: unknown model '" + name + "' (vit, gpt, vit-parts)");
  }
  return c;
}

enum class Mode3 { whole, apart, adjacent };

// One forward, then one backward in `mode`; per-layer backward CPU seconds added to t.
void step(Stage& m, const Tensor& x, Mode3 mode, std::vector<double>& t) {
  const int L = m.num_layers();
  std::vector<Tensor> h(static_cast<std::size_t>(L) + 1);
  h[0] = x;
  for (int i = 0; i < L; ++i) h[i + 1] = m.layer(i).forward(h[i], Call(ringtrain::Mode::train, SamplePosition{}));
  Tensor g = Tensor::empty(h[L].shape());
  for (std::int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] = 1e-3f * float(i % 7);
  for (int i = L; i-- > 0;) {
    const double c0 = cpu_now();
    const bool need_dx = i > 0;  // the first layer's input (images, token ids) takes no gradient
    if (mode == Mode3::whole) {
      g = m.layer(i).backward(g, need_dx, true);
    } else {
      g = m.layer(i).backward_input(g, need_dx, true);
      if (mode == Mode3::adjacent) m.layer(i).backward_weight();
    }
    t[static_cast<std::size_t>(i)] += cpu_now() - c0;
  }
  if (mode != Mode3::apart) return;
  for (int i = L; i-- > 0;) {
    const double c0 = cpu_now();
    m.layer(i).backward_weight();
    t[static_cast<std::size_t>(i)] += cpu_now() - c0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Split backward (zero-bubble I and W) against the whole backward, per layer"};
  int iters = 30;
  std::string models = "vit gpt vit-parts";
  app.add_option("--iters", iters, "timed steps per mode (interleaved; medians)");
  app.add_option("--models", models, "any of vit, gpt, vit-parts");
  std::string only;  // profiling one path (perf record): the others are skipped after the warm-up
  app.add_option("--only", only, "time only whole, apart or adjacent")->check(CLI::IsMember({"whole", "apart", "adjacent"}));
  CLI11_PARSE(app, argc, argv);
  std::string cpu = "unknown CPU";
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::strncmp(line, "model name", 10) == 0) {
        cpu = std::strchr(line, ':') ? std::strchr(line, ':') + 2 : line;
        cpu.erase(cpu.find_last_not_of("\n") + 1);
        break;
      }
    std::fclose(f);
  }
  std::printf("# %s; OpenMP threads %d; process CPU ms per micro-batch, medians of %d interleaved steps\n",
              cpu.c_str(), omp_get_max_threads(), iters);
  std::istringstream ms(models);
  for (std::string name; ms >> name;) {
    Case c = make_case(name);
    Stage m(c.mc, Device::cpu());
    const int L = m.num_layers();
    const auto n = static_cast<std::size_t>(L);
    std::vector<std::vector<double>> t[3];
    for (int w = 0; w < 3; ++w) {  // warm every path (primitives, buffers)
      std::vector<double> z(n, 0.0);
      for (int k = 0; k < 3; ++k) step(m, c.x, Mode3(k), z);
    }
    for (int it = 0; it < iters; ++it)
      for (int k = 0; k < 3; ++k) {
        std::vector<double> v(n, 0.0);
        if (!only.empty() && only != (k == 0 ? "whole" : k == 1 ? "apart" : "adjacent")) {
          t[k].push_back(v);
          continue;
        }
        step(m, c.x, Mode3(k), v);
        t[k].push_back(v);
      }
    std::printf("%s: layer  whole_ms  apart_ms (I+W)  adjacent_ms  apart/whole  adjacent/whole\n", name.c_str());
    double tot[3] = {0, 0, 0};
    for (std::size_t i = 0; i < n; ++i) {
      double med[3];
      for (int k = 0; k < 3; ++k) {
        std::vector<double> col;
        for (auto& row : t[k]) col.push_back(row[i]);
        med[k] = 1e3 * median(col);
      }
      std::printf("%s: %-10s %8.3f %8.3f %8.3f %6.3f %6.3f\n", name.c_str(), m.layer(static_cast<int>(i)).name().c_str(),
                  med[0], med[1], med[2], med[1] / med[0], med[2] / med[0]);
    }
    for (int k = 0; k < 3; ++k) {
      std::vector<double> sums;
      for (auto& row : t[k]) {
        double s = 0;
        for (double v : row) s += v;
        sums.push_back(s);
      }
      tot[k] = 1e3 * median(sums);
    }
    std::printf("%s: backward %8.3f %8.3f %8.3f %6.3f %6.3f (ideal 1.000)\n", name.c_str(), tot[0], tot[1], tot[2],
                tot[1] / tot[0], tot[2] / tot[0]);
  }
  return 0;
}
