// The step-time stall per checkpoint against the state size: how long the
// training loop pauses for a checkpoint with checkpoint.async = true (a host
// snapshot; a background thread writes the file) and = false (the loop writes
// the file itself), beside the time to memcpy the state (parameters and
// optimizer state) measured in the same run. Goal: async stall <= 1.5x memcpy.
// The stall is TrainResult::checkpoint_stalls_s: the loop's time inside each
// save (gather, snapshot, a wait for a previous write still in flight); the
// table gives the median over the checkpoints after the first, and the first
// apart (async: its snapshot buffers are fresh pages, reused afterwards).
// step_ms (sync run) and async_step: median step time away from checkpoints;
// async_step also holds the background write's competition for cores and memory bandwidth.
// Run: build/bench/bench_train_checkpoint_stall [--models vit,resnet] [--device cpu|cuda]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/data/prepare.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

struct Options {
  std::string models = "vit,resnet", device = "cpu", data = "/usr/share/datasets/fashion-mnist", dir;
  int batch = 8, every = 10, checkpoints = 4, threads = 1;
};

struct Run {
  double first_s = 0, stall_s = 0, step_s = 0;  // the first checkpoint's stall (fresh pages), the median of the others; median step
  std::vector<double> all;          // each checkpoint's stall
  std::vector<double> after;        // each checkpoint's following step minus the median step
  std::size_t state_bytes = 0;
  std::int64_t params = 0;
};

TrainConfig model_config(const std::string& model, const Options& o, const std::string& data) {
  TrainConfig c;
  c.model.name = model;
  if (model == "vit") {  // 25 M parameters: 8 blocks of 12 x 512^2
    c.model.width = 512;
    c.model.depth = 8;
    c.model.heads = 8;
  }
  c.data.train = data;
  c.data.test = data;
  c.data.batch_size = o.batch;
  c.optimizer.name = "adamw";  // two moments per parameter: the state is 3x the parameters
  c.optimizer.lr = 1e-4;
  c.train.threads = o.threads;
  c.train.device = o.device;
  c.train.epochs = 1000;
  c.log.format = "plain";
  return c;
}

Run run(const std::string& model, bool async, const Options& o, const std::string& data, const Communicator& w) {
  TrainConfig c = model_config(model, o, data);
  c.checkpoint.dir = (fs::path(o.dir) / (model + (async ? "-async" : "-sync"))).string();
  c.checkpoint.async = async;
  c.checkpoint.every_steps = o.every;
  c.checkpoint.keep = 2;
  // The run ends on a checkpoint step (saved once). `every` must leave the write time to finish,
  // or the next save waits for it (and the stall says so).
  c.train.max_steps = o.every * o.checkpoints;
  TrainerHooks h;
  h.evaluate = false;
  h.report = false;
  std::vector<double> steps, after;
  auto last = Clock::now();
  h.on_step = [&](std::int64_t s, double) {
    auto now = Clock::now();
    // Steps that follow a checkpoint include its stall: the median of the others is the step.
    const double dt = std::chrono::duration<double>(now - last).count();
    if (s > 1 && (s - 1) % o.every != 0) steps.push_back(dt);
    if (s > 1 && (s - 1) % o.every == 0) after.push_back(dt);
    last = now;
  };
  Trainer t(c, w, h);
  last = Clock::now();
  TrainResult r = t.fit();
  Run out;
  std::vector<double> st = r.checkpoint_stalls_s;
  out.all = st;
  if (!st.empty()) out.first_s = st.front();
  if (st.size() > 1) st.erase(st.begin());
  std::sort(st.begin(), st.end());
  out.stall_s = st.empty() ? 0 : st[st.size() / 2];
  std::sort(steps.begin(), steps.end());
  out.step_s = steps.empty() ? 0 : steps[steps.size() / 2];
  for (double a : after) out.after.push_back(a - out.step_s);
  TrainerMemory m = t.memory();
  out.state_bytes = m.params + m.optimizer;
  out.params = m.model_param_count;
  return out;
}

// Copies of `bytes` between two touched host buffers: {best, median} of 7
// (the stalls are medians too: on a shared machine the best is a lucky run).
std::pair<double, double> memcpy_s(std::size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> t;
  for (int i = 0; i < 7; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  if (b[bytes / 2] != 1) std::puts("memcpy?");  // keeps the copy
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Options o;
  CLI::App app{"checkpoint stall: async snapshot vs synchronous write vs memcpy of the state"};
  app.add_option("--models", o.models, "comma-separated: vit (25 M parameters), resnet, cnn, ...");
  app.add_option("--device", o.device, "cpu | cuda");
  app.add_option("--data", o.data, "Fashion-MNIST IDX directory (prepared into a temporary directory)");
  app.add_option("--batch", o.batch, "batch size");
  app.add_option("--every", o.every, "checkpoint.every_steps");
  app.add_option("--checkpoints", o.checkpoints, "checkpoints per run");
  app.add_option("--threads", o.threads, "compute threads");
  app.add_option("--dir", o.dir, "where to write (default: a temporary directory, removed)");
  CLI11_PARSE(app, argc, argv);
  Communicator world = Communicator::world();
  log::set_level(log::Level::warn);
  const bool own_dir = o.dir.empty();
  if (own_dir) o.dir = (fs::temp_directory_path() / "ringtrain-bench-ckpt").string();
  fs::create_directories(o.dir);
  const std::string data = (fs::path(o.dir) / "data").string();
  data::PrepareOptions p;
  p.input = o.data;
  p.output = data;
  p.name = "fashion-mnist";
  data::prepare_dataset(p, world);

  if (world.rank() == 0) {
    std::printf("ratios against the median memcpy of the state (parameters + optimizer state)\n");
    std::printf("%-8s %10s %9s %10s %11s %12s %8s %8s %12s %9s %10s\n", "model", "params", "state_MB", "memcpy_med",
                "sync_stall", "async_stall", "sync/mc", "async/mc", "async_first", "step_ms", "async_step");
  }
  std::stringstream list(o.models);
  for (std::string m; std::getline(list, m, ',');) {
    Run s = run(m, false, o, data, world);
    Run a = run(m, true, o, data, world);
    const auto [mc_best, mc] = memcpy_s(a.state_bytes);
    if (world.rank() == 0)
      std::printf("%-8s %10lld %9.1f %10.2f %11.2f %12.2f %8.2f %8.2f %12.2f %9.1f %10.1f%s\n", m.c_str(),
                  static_cast<long long>(a.params), a.state_bytes / 1e6, mc * 1e3, s.stall_s * 1e3, a.stall_s * 1e3,
                  s.stall_s / mc, a.stall_s / mc, a.first_s * 1e3, s.step_s * 1e3, a.step_s * 1e3,
                  a.stall_s <= 1.5 * mc ? "" : "  (above 1.5x memcpy)");
    if (world.rank() == 0) {
      std::printf("  %s: memcpy best %.2f ms; stall of each checkpoint (ms): sync", m.c_str(), mc_best * 1e3);
      for (double x : s.all) std::printf(" %.1f", x * 1e3);
      std::printf("; async");
      for (double x : a.all) std::printf(" %.1f", x * 1e3);
      std::printf("\n  %s: the step after each checkpoint minus the median step (ms; async: the write competes for cores): sync",
                  m.c_str());
      for (double x : s.after) std::printf(" %.1f", x * 1e3);
      std::printf("; async");
      for (double x : a.after) std::printf(" %.1f", x * 1e3);
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  if (world.rank() == 0 && own_dir) fs::remove_all(o.dir);
  return 0;
}
