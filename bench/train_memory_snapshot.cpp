// The cost and the payoff of checkpoint.memory_every_steps (in-memory
// snapshots with a buddy, src/checkpoint/memory.hpp), measured in one run:
//  1. step time with snapshots every k steps over step time without, the two
//     runs of a round in alternating order, median of the per-round ratios of
//     median step times, the bound beside it;
//  2. bytes per rank (its snapshot file: what its checkpoint part holds), the
//     step's stall (waiting for the previous snapshot, then the copy to host
//     memory) and the helper thread's time (build, write to /dev/shm, send to
//     the buddy, write the buddy's copy), beside a memcpy of the same bytes;
//  3. recovery from memory: a run cut after its snapshot, its disk checkpoint
//     and one emulated node's /dev/shm directory deleted; the time of
//     `--resume auto` (verify, agree, gather the parts into checkpoint.dir,
//     load), with the bytes and the rate beside it.
// Every rank is its own emulated node (checkpoint.memory_node_ranks = 1), so
// every byte is sent to a buddy even on one machine: the "link" is shared memory.
// Run: mpirun -np 2 --bind-to none build/bench/bench_train_memory_snapshot [--model vit] [--every 1]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/data/prepare.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

struct Options {
  std::string model = "vit", data = "/usr/share/datasets/fashion-mnist", dir;
  int batch = 8, steps = 12, warmup = 3, rounds = 3, threads = 1, every = 1;
  double bound = 1.10;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The snapshots' directory of a run writing its checkpoints to `dir`: host memory.
std::string shm_of(const std::string& dir) { return "/dev/shm/ringtrain-bench-" + fs::path(dir).filename().string(); }

TrainConfig config(const Options& o, const std::string& data, const std::string& dir, int every) {
  TrainConfig c;
  c.model.name = o.model;
  if (o.model == "vit") {  // vit 512 x 8: 25 M parameters, as bench_train_checkpoint_stall
    c.model.width = 512;
    c.model.depth = 8;
    c.model.heads = 8;
  }
  c.data.train = c.data.test = data;
  c.data.batch_size = o.batch;
  c.optimizer.name = "adamw";  // two moments per parameter: the state is 3x the parameters
  c.optimizer.lr = 1e-4;
  c.train.threads = o.threads;
  c.train.epochs = 1000;
  c.train.max_steps = o.warmup + o.steps;
  c.log.format = "plain";
  c.checkpoint.dir = dir;
  c.checkpoint.every_epochs = 1000;  // the disk checkpoint only at the end (max_steps)
  c.checkpoint.memory_every_steps = every;
  c.checkpoint.memory_dir = shm_of(dir);
  c.checkpoint.memory_node_ranks = 1;
  return c;
}

struct Run {
  std::vector<double> steps;  // after the warm-up
  TrainResult r;
};

Run run(const Options& o, const std::string& data, const std::string& dir, int every, const Communicator& w) {
  TrainerHooks h;
  h.evaluate = false;
  h.report = false;
  Run out;
  auto last = Clock::now();
  h.on_step = [&](std::int64_t, double) {
    const auto now = Clock::now();
    out.steps.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
  };
  Trainer t(config(o, data, dir, every), w, h);
  last = Clock::now();
  out.r = t.fit();
  out.steps.erase(out.steps.begin(), out.steps.begin() + std::min<std::size_t>(out.steps.size(), o.warmup));
  return out;
}

double memcpy_s(std::size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  if (b[bytes / 2] != 1) std::puts("memcpy?");
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Options o;
  CLI::App app{"checkpoint.memory_every_steps: step overhead, snapshot bytes and times, recovery from memory"};
  app.add_option("--model", o.model, "vit (512 x 8, 25 M parameters), resnet, cnn, ...");
  app.add_option("--data", o.data, "Fashion-MNIST IDX directory (prepared into a temporary directory)");
  app.add_option("--batch", o.batch, "batch size per rank");
  app.add_option("--steps", o.steps, "timed steps per run")->check(CLI::Range(2, 100000));
  app.add_option("--warmup", o.warmup, "untimed first steps");
  app.add_option("--rounds", o.rounds)->check(CLI::PositiveNumber);
  app.add_option("--every", o.every, "checkpoint.memory_every_steps of the snapshot runs")->check(CLI::PositiveNumber);
  app.add_option("--bound", o.bound, "the step-time ratio printed as the bound");
  app.add_option("--threads", o.threads, "compute threads");
  app.add_option("--dir", o.dir, "where to write (default: a temporary directory, removed)");
  CLI11_PARSE(app, argc, argv);
  Communicator world = Communicator::world();
  log::set_level(log::Level::warn);
  const bool own_dir = o.dir.empty();
  if (own_dir) o.dir = (fs::temp_directory_path() / "ringtrain-bench-memory").string();
  const std::string data = (fs::path(o.dir) / "data").string();
  if (world.rank() == 0) fs::create_directories(o.dir);
  world.barrier();
  data::PrepareOptions p;
  p.input = o.data;
  p.output = data;
  p.name = "fashion-mnist";
  data::prepare_dataset(p, world);

  // 1. Paired runs, alternating order.
  std::vector<double> ratio, off_ms, on_ms;
  Run last_on;
  for (int round = 0; round < o.rounds; ++round) {
    Run off, on;
    const std::string d0 = o.dir + "/off-" + std::to_string(round), d1 = o.dir + "/on-" + std::to_string(round);
    if (round % 2 == 0) {
      off = run(o, data, d0, 0, world);
      on = run(o, data, d1, o.every, world);
    } else {
      on = run(o, data, d1, o.every, world);
      off = run(o, data, d0, 0, world);
    }
    ratio.push_back(median(on.steps) / median(off.steps));
    off_ms.push_back(1e3 * median(off.steps));
    on_ms.push_back(1e3 * median(on.steps));
    last_on = std::move(on);
    world.barrier();
    if (world.rank() == 0) {
      fs::remove_all(d0);
      fs::remove_all(d1);
      fs::remove_all(shm_of(d0));
      if (round + 1 < o.rounds) fs::remove_all(shm_of(d1));
    }
    world.barrier();
  }
  // 2. Bytes and times of the last snapshot run (every rank's, the largest printed).
  double bytes = static_cast<double>(last_on.r.memory_bytes), total = bytes;
  allreduce(&bytes, &bytes, 1, DType::f64, ReduceOp::max, world);
  allreduce(&total, &total, 1, DType::f64, ReduceOp::sum, world);
  std::vector<double> stall = last_on.r.memory_stalls_s, helper = last_on.r.memory_helper_s;
  stall.erase(stall.begin());  // the first takes fresh pages
  double stall_ms = 1e3 * median(stall), helper_ms = 1e3 * median(helper), mc_ms = 1e3 * memcpy_s(last_on.r.memory_bytes);
  allreduce(&stall_ms, &stall_ms, 1, DType::f64, ReduceOp::max, world);
  allreduce(&helper_ms, &helper_ms, 1, DType::f64, ReduceOp::max, world);
  allreduce(&mc_ms, &mc_ms, 1, DType::f64, ReduceOp::max, world);

  // 3. Recovery: the last snapshot run's disk checkpoint and emulated node 1 (rank 1's memory) gone.
  const std::string cut = o.dir + "/on-" + std::to_string(o.rounds - 1);
  world.barrier();
  if (world.rank() == 0) {
    for (const auto& e : CheckpointDir(cut, 1).list())
      for (const auto& f : checkpoint_files(e.path)) fs::remove(f);
    if (world.size() > 1) fs::remove_all(shm_of(cut) + "/node-e1");
  }
  world.barrier();
  double recover_s = 0;
  std::int64_t from = -1;
  {
    TrainerHooks h;
    h.evaluate = false;
    h.report = false;
    Trainer t(config(o, data, cut, o.every), world, h);
    world.barrier();
    const auto t0 = Clock::now();
    const bool found = t.resume("auto");
    world.barrier();
    recover_s = std::chrono::duration<double>(Clock::now() - t0).count();
    from = found ? t.loaded().step : -1;
  }
  if (world.rank() == 0) {
    std::printf("# %s, %d rank(s) (each its own emulated node), batch %d/rank, %d timed steps per run after %d, "
                "%d rounds, checkpoint.memory_every_steps = %d vs off\n",
                o.model.c_str(), world.size(), o.batch, o.steps, o.warmup, o.rounds, o.every);
    std::string per;
    for (double x : ratio) {
      char b[16];
      std::snprintf(b, sizeof b, "%s%.3f", per.empty() ? "" : " ", x);
      per += b;
    }
    std::printf("%-44s %10s   %-26s %s\n", "", "median", "per round", "bound");
    std::printf("%-44s %10.3f   %-26s <= %.2f\n", "step time, snapshots / off", median(ratio), per.c_str(), o.bound);
    std::printf("%-44s %10.1f\n", "step time off (ms)", median(off_ms));
    std::printf("%-44s %10.1f\n", "step time with snapshots (ms)", median(on_ms));
    std::printf("%-44s %10.1f   (all ranks %.1f MB)\n", "snapshot bytes per rank (MB, largest)", bytes / 1e6,
                total / 1e6);
    std::printf("%-44s %10.2f   memcpy of those bytes %.2f ms: ratio %.2f\n", "step stall per snapshot (ms, median)",
                stall_ms, mc_ms, stall_ms / mc_ms);
    std::printf("%-44s %10.1f   (%.2f GB/s of snapshot bytes)\n", "helper thread per snapshot (ms, median)", helper_ms,
                bytes / (helper_ms * 1e-3) / 1e9);
    std::printf("%-44s %10.3f   step %lld, %.1f MB gathered and loaded: %.2f GB/s; goal <= 5 s\n",
                "recovery from memory, --resume auto (s)", recover_s, static_cast<long long>(from), total / 1e6,
                total / recover_s / 1e9);
  }
  world.barrier();
  if (world.rank() == 0) {
    fs::remove_all(shm_of(cut));
    if (own_dir) fs::remove_all(o.dir);
  }
  return 0;
}
