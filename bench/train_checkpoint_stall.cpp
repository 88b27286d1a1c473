// The step-time stall per checkpoint against the state size: how long the
// training loop pauses for a checkpoint with checkpoint.async = true (a host
// snapshot; a background thread writes the file) and = false (the loop writes
// the file itself), beside the time to memcpy the state (parameters and
// optimizer state) measured in the same run. Goal: async stall <= 1.5x memcpy.
// The stall is TrainResult::checkpoint_stalls_s: the loop's time inside each
// save (gather, snapshot, a wait for a previous write still in flight); the
// table gives the median over the checkpoints after the first, and the first
// apart (async: its snapshot buffers are fresh pages, reused afterwards).
// step_ms: median step time away from checkpoints (async: with the background
// write competing for cores and memory bandwidth); after_ms: the mean of each
// checkpoint's following step minus step_ms (the stall is not in it).
// Under mpirun (data parallelism, or --pipeline/--tensor/--zero) each mode runs
// twice: every rank writing its part (checkpoint.parallel, the default) and
// rank 0 gathering one file; a stall is the slowest rank's, and the ideal of
// the parallel write is the memcpy of the largest rank's share.
// Run: build/bench/bench_train_checkpoint_stall [--models vit,resnet] [--device cpu|cuda]
//      mpirun -np 2 build/bench/bench_train_checkpoint_stall --models vit [--pipeline 2] [--zero 1|2]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/data/prepare.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

struct Options {
  std::string models = "vit,resnet", device = "cpu", data = "/usr/share/datasets/fashion-mnist", dir;
  int batch = 8, every = 10, checkpoints = 4, threads = 1, pipeline = 1, tensor = 1;
  int zero = 0;  // parallel.zero
};

struct Run {
  double first_s = 0, stall_s = 0, step_s = 0;  // the first checkpoint's stall (fresh pages), the median of the others; median step
  std::vector<double> all;          // each checkpoint's stall
  std::vector<double> after;        // each checkpoint's following step minus the median step
  std::size_t state_bytes = 0;      // the whole model's parameters + optimizer state
  std::size_t rank_bytes = 0;       // the largest part of a parallel checkpoint (else the state)
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

Run run(const std::string& model, bool async, bool parallel, const Options& o, const std::string& data,
        const Communicator& w) {
  TrainConfig c = model_config(model, o, data);
  c.checkpoint.dir = (fs::path(o.dir) / (model + (async ? "-async" : "-sync") + (parallel ? "-parts" : ""))).string();
  c.checkpoint.async = async;
  c.checkpoint.parallel = parallel;
  c.parallel.pipeline = o.pipeline;
  c.parallel.tensor = o.tensor;
  c.parallel.zero = o.zero;
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
  // The step goes on when the slowest rank does: each checkpoint's stall is the maximum over ranks.
  if (!st.empty()) allreduce(st.data(), st.data(), st.size(), DType::f64, ReduceOp::max, w);
  out.all = st;
  if (!st.empty()) out.first_s = st.front();
  if (st.size() > 1) st.erase(st.begin());
  std::sort(st.begin(), st.end());
  out.stall_s = st.empty() ? 0 : st[st.size() / 2];
  std::sort(steps.begin(), steps.end());
  out.step_s = steps.empty() ? 0 : steps[steps.size() / 2];
  for (double a : after) out.after.push_back(a - out.step_s);
  // From the newest checkpoint (rank 0): the state is its parameters and optimizer state, whole; a
  // parallel checkpoint's largest part (what one rank wrote) is the ideal's share.
  out.params = t.memory().model_param_count;
  if (w.rank() == 0) {
    const std::string newest = CheckpointDir(c.checkpoint.dir, 1).latest();
    for (const auto& [name, tensor] : read_checkpoint(newest).tensors)
      if (name.rfind("param/", 0) == 0 || name.rfind("optim/", 0) == 0) out.state_bytes += tensor.nbytes();
    const std::vector<std::string> files = checkpoint_files(newest);  // the file, then its parts
    if (files.size() > 1) out.rank_bytes = 0;
    else out.rank_bytes = out.state_bytes;
    for (std::size_t i = 1; i < files.size(); ++i) {
      std::size_t b = 0;
      for (const auto& [name, tensor] : read_checkpoint_file(files[i]).tensors) b += tensor.nbytes();
      out.rank_bytes = std::max(out.rank_bytes, b);
    }
  }
  std::uint64_t sb = out.state_bytes;
  broadcast(&sb, 1, DType::i64, 0, w);
  out.state_bytes = static_cast<std::size_t>(sb);
  std::uint64_t rb = out.rank_bytes;
  broadcast(&rb, 1, DType::i64, 0, w);
  out.rank_bytes = static_cast<std::size_t>(rb);
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
  app.add_option("--pipeline", o.pipeline, "parallel.pipeline");
  app.add_option("--tensor", o.tensor, "parallel.tensor");
  app.add_option("--zero", o.zero, "parallel.zero (0, 1 or 2)");
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

  const bool multi = world.size() > 1;
  if (world.rank() == 0) {
    std::printf("%d rank(s): pipeline %d x tensor %d x data %d%s, %d thread(s) each\n", world.size(), o.pipeline,
                o.tensor, world.size() / (o.pipeline * o.tensor), o.zero ? cat(" with ZeRO-", o.zero).c_str() : "", o.threads);
    std::printf("ratios against the median memcpy of the state (parameters + optimizer state)%s\n",
                multi ? " and of the largest rank's share (the ideal of the parallel write)" : "");
  }
  std::stringstream list(o.models);
  for (std::string m; std::getline(list, m, ',');) {
    struct Mode {
      const char* name;
      bool async, parallel;
      Run r;
    };
    std::vector<Mode> modes = {{"sync", false, multi, {}}, {"async", true, multi, {}}};
    if (multi) modes = {{"sync, one file", false, false, {}}, {"sync, parts", false, true, {}},
                        {"async, one file", true, false, {}}, {"async, parts", true, true, {}}};
    for (Mode& md : modes) md.r = run(m, md.async, md.parallel, o, data, world);
    const Run& a = modes.back().r;
    const auto [mc_best, mc] = memcpy_s(a.state_bytes);
    const auto [share_best, share] = memcpy_s(a.rank_bytes);  // every rank at once: they share the node's bandwidth
    double share_max = share;
    allreduce(&share_max, &share_max, 1, DType::f64, ReduceOp::max, world);
    if (world.rank() != 0) continue;
    std::printf("%s: %lld parameters, state %.1f MB (memcpy median %.2f ms, best %.2f)", m.c_str(),
                static_cast<long long>(a.params), a.state_bytes / 1e6, mc * 1e3, mc_best * 1e3);
    if (multi) std::printf("; largest rank's share %.1f MB (memcpy on every rank at once %.2f ms)", a.rank_bytes / 1e6,
                           share_max * 1e3);
    std::printf("\n  %-16s %10s %9s %s %11s %9s %10s  %s\n", "mode", "stall_ms", "stall/mc", multi ? "stall/share_mc" : "",
                "first_ms", "step_ms", "after_ms", "each checkpoint's stall (ms)");
    for (const Mode& md : modes) {
      std::printf("  %-16s %10.2f %9.2f ", md.name, md.r.stall_s * 1e3, md.r.stall_s / mc);
      if (multi) std::printf("%14.2f ", md.r.stall_s / share_max);
      double after = 0;
      for (double x : md.r.after) after += x / std::max<std::size_t>(1, md.r.after.size());
      std::printf("%11.2f %9.1f %10.1f  ", md.r.first_s * 1e3, md.r.step_s * 1e3, after * 1e3);
      for (double x : md.r.all) std::printf(" %.1f", x * 1e3);
      std::printf("%s\n", md.async && md.r.stall_s > 1.5 * mc ? "  (above 1.5x memcpy)" : "");
    }
    std::fflush(stdout);
  }
  if (world.rank() == 0 && own_dir) fs::remove_all(o.dir);
  return 0;
}
