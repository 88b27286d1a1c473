// The cost of log.trace_steps (core/trace.hpp) on the steps it traces and on
// the steps it does not, against an untraced run of the same job measured in
// the same invocation. Each round runs the job twice, untraced and with the
// first half of the timed steps traced, in alternating order; per round, the
// traced half's median step time over the untraced run's same half, and the
// untraced half's likewise. Printed: the medians over rounds, with the bounds
// beside them (issue 46: <= 1.03 traced, 1.00 outside the window).
// Run: mpirun -np 2 build/bench/bench_train_trace_overhead [--model cnn] [--steps 60] [--rounds 5]
#include <CLI/CLI.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string model = "cnn", data = "data/fashion-mnist", trace = "/tmp/ringtrain-trace-overhead.json";
  int batch = 64, steps = 60, warmup = 10, rounds = 5, threads = 1;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Step times of one run: [0, warmup) dropped, then `steps` timed.
std::vector<double> step_times(const Options& o, const Communicator& world, const std::string& window) {
  TrainConfig c;
  c.model.name = o.model;
  c.data.train = c.data.test = o.data;
  c.data.batch_size = o.batch;
  c.train.threads = o.threads;
  c.train.epochs = 1000;
  c.train.max_steps = o.warmup + o.steps;
  c.log.format = "plain";
  c.log.trace_steps = window;
  c.log.trace = o.trace;
  TrainerHooks hooks;
  hooks.evaluate = false;
  hooks.report = false;
  std::vector<double> times;
  auto last = Clock::now();
  hooks.on_step = [&](std::int64_t, double) {
    const auto now = Clock::now();
    times.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
  };
  Trainer t(c, world, hooks);
  last = Clock::now();
  t.fit();
  return {times.begin() + o.warmup, times.end()};
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    Options o;
    CLI::App app("log.trace_steps overhead against an untraced run");
    app.add_option("--model", o.model);
    app.add_option("--data", o.data, "prepared data set (make run prepares data/fashion-mnist)");
    app.add_option("--batch", o.batch);
    app.add_option("--steps", o.steps, "timed steps per run; the first half is traced")->check(CLI::Range(4, 100000));
    app.add_option("--warmup", o.warmup);
    app.add_option("--rounds", o.rounds)->check(CLI::PositiveNumber);
    app.add_option("--threads", o.threads);
    app.add_option("--trace", o.trace, "where the traced runs write their file");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      MPI_Finalize();
      return app.exit(e);
    }
    Communicator world = Communicator::world();
    const int half = o.steps / 2;
    const std::string window = std::to_string(o.warmup + 1) + "-" + std::to_string(o.warmup + half);
    std::vector<double> in_ratio, out_ratio, base_ms;
    for (int r = 0; r < o.rounds; ++r) {
      std::vector<double> plain, traced;
      if (r % 2 == 0) {
        plain = step_times(o, world, "");
        traced = step_times(o, world, window);
      } else {
        traced = step_times(o, world, window);
        plain = step_times(o, world, "");
      }
      auto part = [&](const std::vector<double>& v, bool first) {
        return first ? std::vector<double>(v.begin(), v.begin() + half) : std::vector<double>(v.begin() + half, v.end());
      };
      in_ratio.push_back(median(part(traced, true)) / median(part(plain, true)));
      out_ratio.push_back(median(part(traced, false)) / median(part(plain, false)));
      base_ms.push_back(1e3 * median(plain));
    }
    if (world.rank() == 0) {
      const auto bytes = std::filesystem::exists(o.trace) ? std::filesystem::file_size(o.trace) : 0;
      std::printf("# %s, %d ranks, batch %d/rank, %d timed steps per run (steps %s traced), %d rounds\n",
                  o.model.c_str(), world.size(), o.batch, o.steps, window.c_str(), o.rounds);
      std::printf("# untraced step: median %.2f ms; trace file of %d steps: %.1f KB\n", median(base_ms), half,
                  static_cast<double>(bytes) / 1024);
      std::printf("%-34s %10s %10s   %s\n", "steps", "median", "per round", "bound");
      std::string per_in, per_out;
      for (std::size_t i = 0; i < in_ratio.size(); ++i) {
        per_in += (i ? " " : "") + std::to_string(in_ratio[i]).substr(0, 5);
        per_out += (i ? " " : "") + std::to_string(out_ratio[i]).substr(0, 5);
      }
      std::printf("%-34s %10.3f   %s   <= 1.03\n", "traced / untraced (in the window)", median(in_ratio), per_in.c_str());
      std::printf("%-34s %10.3f   %s   1.00 (noise)\n", "traced / untraced (after it)", median(out_ratio),
                  per_out.c_str());
    }
  }
  MPI_Finalize();
  return rc;
}
