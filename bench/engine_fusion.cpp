// Fusion benchmark: the parameter tensors of a CIFAR ResNet-20 (59 tensors,
// 0.27 M float32 parameters) all-reduced through the engine each "step",
// submitted in reverse layer order (as backward produces them), then waited
// for. Configurations, measured in the same run:
//   fused     default fusion threshold (64 MiB): one fused all-reduce per cycle
//   unfused   threshold 0: one all-reduce per tensor
//   no-cache  fused, response cache disabled: full negotiation every step
// Prints the median step time of each and the speed-up of fusion; --json
// appends one JSON object per configuration to a file.
//
//   mpirun -np 2 build/bench_engine_fusion [--steps 500] [--rounds 5] [--algorithm ring]
#include <mpi.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/engine/engine.hpp"

using namespace ringtrain;

namespace {

struct Param {
  std::string name;
  Shape shape;
};

std::vector<Param> resnet20_params() {
  std::vector<Param> ps{{"conv1.weight", {16, 3, 3, 3}}, {"bn1.weight", {16}}, {"bn1.bias", {16}}};
  int cin = 16;
  for (int stage = 0; stage < 3; ++stage) {
    int c = 16 << stage;
    for (int b = 0; b < 3; ++b) {
      std::string p = cat("layer", stage + 1, ".", b, ".");
      ps.push_back({p + "conv1.weight", {c, cin, 3, 3}});
      ps.push_back({p + "bn1.weight", {c}});
      ps.push_back({p + "bn1.bias", {c}});
      ps.push_back({p + "conv2.weight", {c, c, 3, 3}});
      ps.push_back({p + "bn2.weight", {c}});
      ps.push_back({p + "bn2.bias", {c}});
      cin = c;
    }
  }
  ps.push_back({"fc.weight", {10, 64}});
  ps.push_back({"fc.bias", {10}});
  return ps;
}

struct Result {
  std::string config;
  EngineOptions opts;
  std::vector<double> times;
  EngineStats stats;  // summed over rounds
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  void finish() {
    std::sort(times.begin(), times.end());
    median_ms = times[times.size() / 2];
    p10_ms = times[times.size() / 10];
    p90_ms = times[times.size() * 9 / 10];
  }
};

void add(EngineStats& a, const EngineStats& b) {
  a.allreduces += b.allreduces;
  a.negotiations += b.negotiations;
  a.cache_hits += b.cache_hits;
  a.allreduce_seconds += b.allreduce_seconds;
  a.wait_seconds += b.wait_seconds;
}

// One round of `steps` measured steps of configuration `r` (after `warmup`).
void run(Result& r, const std::vector<Param>& ps, int warmup, int steps) {
  auto comm = Communicator::world();
  const EngineOptions& o = r.opts;
  std::vector<Tensor> grads;
  for (auto& p : ps) {
    grads.push_back(Tensor::empty(p.shape));
    grads.back().fill_(0.001 * (comm.rank() + 1));
  }
  Engine eng(comm, o);
  std::vector<double> times;
  std::vector<Handle> hs(ps.size());
  for (int step = 0; step < warmup + steps; ++step) {
    if (step == warmup) eng.reset_stats();
    comm.barrier();  // every rank starts the step together
    auto t0 = std::chrono::steady_clock::now();
    for (int i = static_cast<int>(ps.size()) - 1; i >= 0; --i) hs[i] = eng.allreduce_async(ps[i].name, grads[i]);
    for (auto& h : hs) eng.wait(h);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // The slowest rank defines the step.
    MPI_Allreduce(MPI_IN_PLACE, &ms, 1, MPI_DOUBLE, MPI_MAX, comm.handle("bench"));
    if (step >= warmup) r.times.push_back(ms);
  }
  add(r.stats, eng.stats());
}

// CPU seconds this process used (all threads).
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// The engine's cost while nothing is submitted: CPU share of one core used by
// a rank whose engine idles for `seconds` (the max over ranks).
double idle_cpu_share(EngineOptions o, double seconds) {
  auto comm = Communicator::world();
  o.timeline.clear();
  Engine eng(comm, o);
  comm.barrier();
  double c0 = cpu_seconds();
  auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  double share = (cpu_seconds() - c0) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &share, 1, MPI_DOUBLE, MPI_MAX, comm.handle("bench"));
  return share;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  CLI::App app{"ringtrain fusion engine benchmark: ResNet-20 gradients, threshold 0 vs default"};
  int steps = 200, warmup = 10, rounds = 5;
  double cycle_ms = 1.0;
  std::string algorithm = "auto", json_path;
  app.add_option("--steps", steps, "measured steps per configuration")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "unmeasured steps at the start of each round")->check(CLI::NonNegativeNumber);
  app.add_option("--rounds", rounds, "configurations alternate this many times (steps split among rounds)")
      ->check(CLI::PositiveNumber);
  app.add_option("--cycle-ms", cycle_ms, "engine cycle time in ms");
  app.add_option("--algorithm", algorithm, "all-reduce algorithm: auto, ring, tree, mpi");
  app.add_option("--json", json_path, "append results as JSON lines to this file (rank 0)");
  std::string timeline;
  app.add_option("--timeline", timeline, "write the engine's Chrome-trace timeline to this file (rank 0)");
  CLI11_PARSE(app, argc, argv);

  auto comm = Communicator::world();
  auto ps = resnet20_params();
  std::int64_t numel = 0;
  for (auto& p : ps) numel += shape_numel(p.shape);

  EngineOptions base;
  base.cycle_time_ms = cycle_ms;
  base.collective.algorithm = parse_algorithm(algorithm);
  base.timeline = timeline;
  EngineOptions unfused = base;
  unfused.fusion_threshold = 0;
  EngineOptions nocache = base;
  nocache.cache_capacity = 0;

  // Configurations alternate round by round so that background load on a
  // shared machine affects them alike.
  std::vector<Result> rs(3);
  rs[0].config = "unfused", rs[0].opts = unfused;
  rs[1].config = "fused", rs[1].opts = base;
  rs[2].config = "fused-no-cache", rs[2].opts = nocache;
  int per_round = std::max(1, steps / rounds);
  steps = per_round * rounds;
  for (int round = 0; round < rounds; ++round)
    for (auto& r : rs) run(r, ps, warmup, per_round);
  for (auto& r : rs) r.finish();
  double idle = idle_cpu_share(base, 1.0);

  if (comm.rank() == 0) {
    std::printf("ResNet-20 gradients: %zu tensors, %lld float32 parameters (%.2f MiB), %d ranks, cycle %.2f ms, "
                "algorithm %s, %d steps\n",
                ps.size(), static_cast<long long>(numel), numel * 4.0 / (1 << 20), comm.size(), cycle_ms,
                algorithm.c_str(), steps);
    std::printf("%-16s %10s %10s %10s %12s %12s %12s %12s\n", "config", "median_ms", "p10_ms", "p90_ms",
                "allreduces/st", "negot/step", "cache_hits", "ar_ms/step");
    for (auto& r : rs)
      std::printf("%-16s %10.3f %10.3f %10.3f %12.1f %12.2f %12llu %12.3f\n", r.config.c_str(), r.median_ms,
                  r.p10_ms, r.p90_ms, double(r.stats.allreduces) / steps, double(r.stats.negotiations) / steps,
                  static_cast<unsigned long long>(r.stats.cache_hits), 1e3 * r.stats.allreduce_seconds / steps);
    std::printf("fusion speed-up (unfused / fused median step): %.2fx\n", rs[0].median_ms / rs[1].median_ms);
    std::printf("response cache speed-up (no-cache / fused median step): %.2fx\n", rs[2].median_ms / rs[1].median_ms);
    std::printf("idle engine: %.1f%% of a core per rank (cycle %.2f ms)\n", 100 * idle, cycle_ms);
    if (!json_path.empty()) {
      std::ofstream f(json_path, std::ios::app);
      for (auto& r : rs)
        f << nlohmann::json{{"bench", "engine_fusion"}, {"config", r.config}, {"ranks", comm.size()},
                            {"tensors", ps.size()}, {"params", numel}, {"cycle_ms", cycle_ms},
                            {"algorithm", algorithm}, {"steps", steps}, {"median_ms", r.median_ms},
                            {"p10_ms", r.p10_ms}, {"p90_ms", r.p90_ms},
                            {"allreduces", r.stats.allreduces}, {"negotiations", r.stats.negotiations},
                            {"cache_hits", r.stats.cache_hits}}
                 .dump()
          << "\n";
    }
  }
  return 0;
}
