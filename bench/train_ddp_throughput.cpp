// Training throughput at the rank count of the launch, against references
// measured in the same invocation:
//   - ringtrain on all ranks vs ringtrain on rank 0 alone (scaling efficiency);
//   - ringtrain vs PyTorch DDP (gloo) on the same model, batch, data, threads;
//   - overlap: step time with the fusion engine vs compute alone (no all-reduce);
//   - fusion: threshold 0 (one all-reduce per tensor) vs the default.
// Run: mpirun -np 2 build/bench/bench_train_ddp_throughput [--model cnn] [--steps 60]
#include <CLI/CLI.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/data/prepare.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string model = "cnn", data = "data/fashion-mnist", json;
  int batch = 64, steps = 60, warmup = 10, threads = 1;
  bool torch = true, overlap = true, fusion = true, single = true;
};

// Median time per optimizer step (after warm-up) of a ringtrain run on `comm`.
double median_step_s(const Options& o, const Communicator& comm, std::int64_t fusion_threshold, bool skip_allreduce) {
  TrainConfig c;
  c.model.name = o.model;
  c.data.train = o.data;
  c.data.test = o.data;
  c.data.batch_size = o.batch;
  c.train.threads = o.threads;
  c.train.epochs = 1000;
  c.train.max_steps = o.warmup + o.steps;
  c.comm.fusion_threshold = fusion_threshold;
  c.log.format = "plain";
  TrainerHooks hooks;
  hooks.evaluate = false;
  hooks.report = false;
  hooks.skip_allreduce = skip_allreduce;
  std::vector<double> times;
  auto last = Clock::now();
  hooks.on_step = [&](std::int64_t, double) {
    auto now = Clock::now();
    times.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
  };
  Trainer t(c, comm, hooks);
  last = Clock::now();
  t.fit();
  std::vector<double> kept(times.begin() + std::min<std::size_t>(times.size(), o.warmup), times.end());
  std::sort(kept.begin(), kept.end());
  double med = kept.empty() ? 0 : kept[kept.size() / 2];
  MPI_Allreduce(MPI_IN_PLACE, &med, 1, MPI_DOUBLE, MPI_MAX, comm.handle());  // the slowest rank sets the pace
  return med;
}

// Waits at a barrier without spinning, so an idle rank leaves its core to others.
void idle_barrier(const Communicator& comm) {
  MPI_Request r;
  MPI_Ibarrier(comm.handle(), &r);
  int done = 0;
  while (!done) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Communicator world = Communicator::world();
  Options o;
  CLI::App app{"ringtrain training throughput vs PyTorch DDP, single rank, compute alone and no fusion"};
  app.add_option("--model", o.model, "cnn | resnet | mlp")->capture_default_str();
  app.add_option("--data", o.data, "prepared data directory (prepared from Debian's Fashion-MNIST if missing)")->capture_default_str();
  app.add_option("--batch", o.batch, "batch per rank")->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")->capture_default_str();
  app.add_option("--threads", o.threads, "threads per rank")->capture_default_str();
  app.add_option("--json", o.json, "also write the results here");
  app.add_flag("!--no-torch", o.torch, "skip the PyTorch DDP reference");
  app.add_flag("!--no-overlap", o.overlap, "skip the compute-alone baseline");
  app.add_flag("!--no-fusion", o.fusion, "skip the threshold-0 run");
  app.add_flag("!--no-single", o.single, "skip the 1-rank run");
  CLI11_PARSE(app, argc, argv);
  const int p = world.size();
  const bool root = world.rank() == 0;

  if (!std::filesystem::exists(o.data + "/fashion-mnist-train.h5") && o.data == "data/fashion-mnist") {
    data::PrepareOptions po;
    po.input = "/usr/share/datasets/fashion-mnist";
    po.output = o.data;
    po.name = "fashion-mnist";
    data::prepare_dataset(po, world);
  }

  nlohmann::json out = {{"model", o.model}, {"ranks", p}, {"batch_per_rank", o.batch}, {"threads", o.threads}};
  auto ips = [&](double step_s, int ranks) { return step_s > 0 ? o.batch * ranks / step_s : 0.0; };

  double dp = median_step_s(o, world, 64 << 20, false);
  out["ringtrain_images_per_s"] = ips(dp, p);
  double alone = 0, nofuse = 0, single = 0;
  if (o.overlap) alone = median_step_s(o, world, 64 << 20, true);
  if (o.fusion) nofuse = median_step_s(o, world, 0, false);
  if (o.single && p > 1) {
    if (root) single = median_step_s(o, Communicator::dup_of(MPI_COMM_SELF, "self"), 64 << 20, false);
    idle_barrier(world);
  }
  double torch_ips = 0;
  if (o.torch && root) {
    std::string src = o.data + "/" + "fashion-mnist-train.h5";
    if (!std::filesystem::exists(src)) src = o.data;
    std::string cmd = "/usr/bin/python3 bench/reference/torch_ddp.py --data " + src + " --model " + o.model +
                      " --ranks " + std::to_string(p) + " --batch " + std::to_string(o.batch) + " --threads " +
                      std::to_string(o.threads) + " --steps " + std::to_string(o.steps) + " --warmup " +
                      std::to_string(o.warmup) + " > /tmp/rt-torch-ddp.json 2>/tmp/rt-torch-ddp.err";
    if (std::system(cmd.c_str()) == 0) {
      std::ifstream f("/tmp/rt-torch-ddp.json");
      nlohmann::json j;
      f >> j;
      torch_ips = j.value("images_per_s", 0.0);
      out["torch"] = j;
    } else {
      std::fprintf(stderr, "PyTorch DDP reference failed (see /tmp/rt-torch-ddp.err)\n");
    }
  }
  if (o.torch && p > 1) idle_barrier(world);

  if (root) {
    std::printf("# %s, batch %d per rank, %d thread(s) per rank, %d rank(s); medians over %d steps\n",
                o.model.c_str(), o.batch, o.threads, p, o.steps);
    std::printf("%-44s %12s %10s\n", "run", "images/s", "step ms");
    std::printf("%-44s %12.0f %10.2f\n", "ringtrain (fusion engine, default threshold)", ips(dp, p), 1e3 * dp);
    if (o.overlap) std::printf("%-44s %12.0f %10.2f\n", "ringtrain compute alone (no all-reduce)", ips(alone, p), 1e3 * alone);
    if (o.fusion) std::printf("%-44s %12.0f %10.2f\n", "ringtrain fusion threshold 0", ips(nofuse, p), 1e3 * nofuse);
    if (single > 0) std::printf("%-44s %12.0f %10.2f\n", "ringtrain 1 rank", ips(single, 1), 1e3 * single);
    if (torch_ips > 0) std::printf("%-44s %12.0f %10.2f\n", "PyTorch DDP (gloo)", torch_ips, 1e3 * o.batch * p / torch_ips);
    std::printf("ratios:\n");
    if (torch_ips > 0) std::printf("  ringtrain / PyTorch DDP images/s           %6.2fx\n", ips(dp, p) / torch_ips);
    if (single > 0) std::printf("  %d-rank / (%d x 1-rank) images/s            %6.2f\n", p, p, ips(dp, p) / (p * ips(single, 1)));
    if (o.overlap) std::printf("  step with engine / compute alone            %6.3f\n", dp / alone);
    if (o.fusion) std::printf("  step without fusion / with fusion          %6.3f\n", nofuse / dp);
    out["compute_alone_images_per_s"] = ips(alone, p);
    out["no_fusion_images_per_s"] = ips(nofuse, p);
    out["single_rank_images_per_s"] = ips(single, 1);
    out["torch_ddp_images_per_s"] = torch_ips;
    if (!o.json.empty()) std::ofstream(o.json) << out.dump(2) << "\n";
  }
  return 0;
}
