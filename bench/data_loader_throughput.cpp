// bench_data_loader_throughput: how fast the loader delivers batches, next to
// how fast training consumes them, measured in the same run.
//  1. Fashion-MNIST (Debian's IDX files -> one HDF5 file) and synthetic
//     3x224x224 shards (ImageNet-like, a few hundred MB, deleted unless --keep).
//  2. Per data set, cold and warm page cache: "cold" = posix_fadvise(
//     POSIX_FADV_DONTNEED) on each file after fdatasync (drops only OUR files'
//     pages; dropping caches globally needs root and disturbs the machine).
//     Loader throughput = samples/s and MB/s (source bytes) per rank of a full
//     epoch consumed as fast as possible, open (and cache fill) included, for the
//     in-memory cache, per-batch reads, and MPI-IO collective per-batch reads.
//  3. The step-time test: a consumer whose step is a fixed compute cost
//     (--step-us, default batch/1300 s = the `cnn` rate of one core; for the
//     224x224 set batch/--synthetic-rate, default 100 img/s) runs
//     --steps steps on the real loader and on one batch already in memory;
//     prints wait fraction and the step-time ratio (target <= 1.02).
//
//   bench_data_loader_throughput [--fmnist DIR] [--synthetic-samples 1200] [--shards 4]
//       [--batch 64] [--rate 1300] [--step-us N] [--steps 150] [--workdir DIR] [--keep]
//       [--json out.json]   (also runs under mpirun: each rank reads its part)
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ringtrain/core/log.hpp"
#include "ringtrain/data/loader.hpp"
#include "ringtrain/data/prepare.hpp"

using namespace ringtrain;
using namespace ringtrain::data;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void drop_page_cache(const std::vector<std::string>& files) {
  for (const auto& f : files) {
    int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Busy work of `us` microseconds (a compute-bound training step stand-in).
void spin(double us, const Tensor& touch) {
  auto t0 = Clock::now();
  volatile float sink = 0;
  const float* p = touch.data<float>();
  sink = sink + p[0] + p[touch.numel() - 1];
  while (since(t0) * 1e6 < us) {
  }
}

struct Throughput {
  double open_s = 0, epoch_s = 0, samples_per_s = 0, mb_per_s = 0;
  bool cached = false;
};

Throughput measure(const LoaderOptions& o, const Communicator& comm, bool cold) {
  if (cold) drop_page_cache(o.files);
  comm.barrier();
  auto t0 = Clock::now();
  Loader l(o, comm);
  Throughput t;
  t.open_s = since(t0);
  t.cached = l.cached();
  std::int64_t n = 0;
  auto t1 = Clock::now();
  while (auto b = l.next()) n += b->images.dim(0);
  t.epoch_s = since(t1);
  double total = since(t0);
  t.samples_per_s = double(n) / total;
  t.mb_per_s = t.samples_per_s * double(l.info().sample_bytes()) / 1e6;
  return t;
}

struct StepTest {
  double loader_step_s = 0, memory_step_s = 0, wait_fraction = 0;
};

// Alternating rounds (loader steps, then the same number of in-memory steps) so that
// background load on a shared machine hits both alike; medians over rounds.
StepTest step_test(const LoaderOptions& o, const Communicator& comm, double step_us, int steps, int rounds) {
  StepTest r;
  Loader l(o, comm);
  // Warm-up: the first batch (thread start, first read) is not a steady-state step.
  auto first = l.next();
  Tensor keep = first->images.clone();
  const int per = std::max(1, steps / rounds);
  std::vector<double> with_loader, in_memory, waits;
  for (int round = 0; round < rounds; ++round) {
    double w0 = l.wait_seconds();
    int done = 0;
    auto t0 = Clock::now();
    while (done < per) {
      auto b = l.next();
      if (!b) continue;  // epoch boundary: the next call starts the next epoch
      spin(step_us, b->images);
      ++done;
    }
    double loader_s = since(t0);
    waits.push_back((l.wait_seconds() - w0) / loader_s);
    with_loader.push_back(loader_s / per);
    auto t1 = Clock::now();
    for (int i = 0; i < per; ++i) spin(step_us, keep);
    in_memory.push_back(since(t1) / per);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  r.loader_step_s = median(with_loader);
  r.memory_step_s = median(in_memory);
  r.wait_fraction = median(waits);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  CLI::App app{"data loader throughput vs training consumption"};
  std::string fmnist = "/usr/share/datasets/fashion-mnist", workdir, json_out;
  std::int64_t synth = 1200, batch = 64;
  int shards = 4, steps = 150, rounds = 5;
  double rate = 1300, step_us = 0, synth_rate = 100;
  bool keep = false;
  app.add_option("--fmnist", fmnist, "Fashion-MNIST IDX directory (\"\" to skip)");
  app.add_option("--synthetic-samples", synth, "3x224x224 synthetic samples (0 to skip)");
  app.add_option("--shards", shards, "synthetic shard files");
  app.add_option("--batch", batch, "per-rank batch");
  app.add_option("--rate", rate, "training consumption rate of one rank, images/s (cnn on one core ~1300)");
  app.add_option("--step-us", step_us, "consumer compute per step in us (default batch / rate)");
  app.add_option("--synthetic-rate", synth_rate,
                 "training rate for 3x224x224 images, images/s/rank (a ResNet-sized model on CPU is far below 100)");
  app.add_option("--steps", steps, "steps of the step-time test (split over --rounds)");
  app.add_option("--rounds", rounds, "alternating loader/in-memory rounds of the step-time test");
  app.add_option("--workdir", workdir, "where to write the HDF5 files (default: a temp dir)");
  app.add_flag("--keep", keep, "keep the generated files");
  app.add_option("--json", json_out, "write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  Communicator comm = Communicator::world();
  const bool root = comm.rank() == 0;
  if (step_us <= 0) step_us = 1e6 * double(batch) / rate;
  if (workdir.empty()) {
    long long pid = ::getpid();
    MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, comm.handle());
    workdir = (std::filesystem::temp_directory_path() / ("rt_bench_data_" + std::to_string(pid))).string();
  }
  nlohmann::json out;
  out["ranks"] = comm.size(), out["batch"] = batch, out["rate"] = rate, out["step_us"] = step_us;
  if (root)
    std::printf("data loader throughput: %d rank(s), batch %lld per rank, training rate %.0f img/s/rank "
                "(step %.1f ms)\n",
                comm.size(), (long long)batch, rate, step_us / 1e3);

  struct Set {
    std::string label;
    std::vector<std::string> files;
    CachePolicy cache;
    double rate;  // training consumption, images/s/rank
    bool mpio = false;
  };
  std::vector<Set> sets;
  if (!fmnist.empty()) {
    PrepareOptions po;
    po.input = fmnist;
    po.output = workdir + "/fmnist";
    auto t0 = Clock::now();
    auto ds = prepare_dataset(po, comm);
    if (root) std::printf("  prepare fashion-mnist: %.2f s (60000 + 10000 images)\n", since(t0));
    sets.push_back({"fashion-mnist (in-memory cache)", ds.train_files, CachePolicy::auto_, rate});
    sets.push_back({"fashion-mnist (per-batch reads)", ds.train_files, CachePolicy::never, rate});
    // MPI-IO wants the contiguous layout: parallel HDF5 1.10 maps a scattered selection
    // on chunked data element by element (~50x slower here).
    po.output = workdir + "/fmnist-contiguous";
    po.storage.chunk_samples = -1;
    auto dc = prepare_dataset(po, comm);
    sets.push_back({"fashion-mnist (MPI-IO, contiguous file)", dc.train_files, CachePolicy::never, rate, true});
  }
  if (synth > 0) {
    SyntheticOptions so;
    so.output = workdir + "/synthetic";
    so.train_samples = synth;
    so.storage.num_shards = shards;
    auto t0 = Clock::now();
    auto ds = generate_synthetic(so, comm);
    double mb = double(synth) * 3 * 224 * 224 / 1e6;
    if (root) std::printf("  generate synthetic 3x224x224: %.2f s (%lld samples, %.0f MB, %d shards, %.0f MB/s)\n",
                          since(t0), (long long)synth, mb, shards, mb / since(t0));
    sets.push_back({"synthetic 3x224x224 (per-batch reads)", ds.train_files, CachePolicy::never, synth_rate});
  }

  if (root)
    std::printf("\n%-40s %-5s %8s %9s %11s %9s %10s %12s\n", "data set", "cache", "open s", "epoch s", "samples/s",
                "MB/s", "x training", "all ranks/s");
  for (const auto& s : sets) {
    LoaderOptions o;
    o.files = s.files;
    o.batch_size = batch;
    o.cache = s.cache;
    o.mpio = s.mpio;
    o.prefetch_depth = 4;
    for (bool cold : {true, false}) {
      Throughput t = measure(o, comm, cold);
      double agg = t.samples_per_s;
      MPI_Allreduce(MPI_IN_PLACE, &agg, 1, MPI_DOUBLE, MPI_SUM, comm.handle());
      if (root)
        std::printf("%-40s %-5s %8.3f %9.3f %11.0f %9.1f %9.1fx %12.0f\n", s.label.c_str(), cold ? "cold" : "warm",
                    t.open_s, t.epoch_s, t.samples_per_s, t.mb_per_s, t.samples_per_s / s.rate, agg);
      out["throughput"].push_back({{"set", s.label}, {"page_cache", cold ? "cold" : "warm"}, {"open_s", t.open_s},
                                   {"epoch_s", t.epoch_s}, {"samples_per_s", t.samples_per_s},
                                   {"samples_per_s_all_ranks", agg}, {"mb_per_s", t.mb_per_s},
                                   {"training_rate", s.rate}, {"ratio_to_training", t.samples_per_s / s.rate}, {"cached", t.cached}});
    }
  }
  if (root)
    std::printf("\nstep-time test (%d steps of compute = batch / training rate, warm cache)\n%-40s %9s %12s %12s %9s %8s\n",
                steps, "data set", "step ms", "loader ms", "memory ms", "ratio", "wait %");
  for (const auto& s : sets) {
    LoaderOptions o;
    o.files = s.files;
    o.batch_size = batch;
    o.cache = s.cache;
    o.mpio = s.mpio;
    const double us = s.rate == rate ? step_us : 1e6 * double(batch) / s.rate;
    const int n = s.rate == rate ? steps : std::max(rounds * 2, int(steps * 2e6 / (us * 150)));
    StepTest r = step_test(o, comm, us, n, s.rate == rate ? rounds : std::min(rounds, n));
    if (root)
      std::printf("%-40s %9.1f %12.3f %12.3f %9.4f %7.2f%%\n", s.label.c_str(), us / 1e3, r.loader_step_s * 1e3,
                  r.memory_step_s * 1e3, r.loader_step_s / r.memory_step_s, 100 * r.wait_fraction);
    out["step_test"].push_back({{"set", s.label}, {"loader_step_s", r.loader_step_s},
                                {"memory_step_s", r.memory_step_s}, {"ratio", r.loader_step_s / r.memory_step_s},
                                {"wait_fraction", r.wait_fraction}, {"step_us", us}, {"steps", n}});
  }
  comm.barrier();
  if (!keep && root) std::filesystem::remove_all(workdir);
  if (root && !json_out.empty()) std::ofstream(json_out) << out.dump(2) << "\n";
  if (root && keep) std::printf("kept %s\n", workdir.c_str());
  return 0;
}
