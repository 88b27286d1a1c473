// Resume cost per rank: one phase per process set, so that each peak RSS is
// that process's own (bench/train_resume.sh runs the phases and the table):
//   --phase prepare   Fashion-MNIST into <dir>/data (its own process: the IDX
//                     reading would otherwise count in the peaks)
//   --phase train     --steps optimizer steps, no checkpoint: each rank's peak
//                     RSS while training
//   --phase write     the same steps, then a checkpoint into <dir>/<layout>
//                     (checkpoint.parallel: every rank writes its part)
//   --phase resume    a trainer built, then Trainer::resume(<dir>/<from>)
//                     timed between barriers (the slowest rank), and each
//                     rank's peak RSS when it returns; beside it the floor of
//                     a sharded read: every rank reading 1/ranks of the
//                     checkpoint's bytes (pread of its part files in turn)
// Prints one CSV line per rank: phase,layout,from,rank,peak_rss_mb,seconds,floor_s.
// The source compiles against ringtrain before and after the sharded read
// (the public Trainer API only), so one run compares two builds.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

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
  std::string phase, dir, from, mnist = "/usr/share/datasets/fashion-mnist";
  int pipeline = 1, tensor = 1, steps = 2, threads = 1;
};

std::string layout_name(const Options& o) { return cat("p", o.pipeline, "t", o.tensor); }

TrainConfig config(const Options& o) {
  TrainConfig c;
  c.model.name = "vit";  // 25 M parameters: 8 blocks of 12 x 512^2
  c.model.width = 512;
  c.model.depth = 8;
  c.model.heads = 8;
  c.data.train = (fs::path(o.dir) / "data").string();
  c.data.test = c.data.train;
  c.data.global_batch = 32;
  c.optimizer.name = "adamw";  // two moments per parameter: the state is 3x the parameters
  c.optimizer.lr = 1e-4;
  c.parallel.pipeline = o.pipeline;
  c.parallel.tensor = o.tensor;
  c.parallel.partition = "params";
  c.train.threads = o.threads;
  c.train.epochs = 1;
  c.train.max_steps = o.steps;
  c.log.format = "plain";
  return c;
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

// Every rank reads 1/size of the checkpoint's files' bytes (whole files in turn): the I/O floor.
double read_floor_s(const std::string& dir, const Communicator& w) {
  std::vector<std::pair<std::string, std::uintmax_t>> files;
  std::uintmax_t total = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".h5") {
      files.emplace_back(e.path().string(), e.file_size());
      total += e.file_size();
    }
  std::sort(files.begin(), files.end());
  const std::uintmax_t lo = total * w.rank() / w.size(), hi = total * (w.rank() + 1) / w.size();
  std::vector<char> buf(8 << 20);
  w.barrier();
  const auto t0 = Clock::now();
  std::uintmax_t at = 0;
  for (const auto& [path, size] : files) {
    const std::uintmax_t b = std::max(lo, at), e = std::min(hi, at + size);
    if (b < e) {
      const int fd = ::open(path.c_str(), O_RDONLY);
      for (std::uintmax_t p = b; fd >= 0 && p < e;) {
        const ssize_t n = ::pread(fd, buf.data(), std::min<std::uintmax_t>(buf.size(), e - p), static_cast<off_t>(p - at));
        if (n <= 0) break;
        p += static_cast<std::uintmax_t>(n);
      }
      if (fd >= 0) ::close(fd);
    }
    at += size;
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  allreduce(&s, &s, 1, DType::f64, ReduceOp::max, w);
  return s;
}

void print(const Options& o, const Communicator& w, double mine, double seconds, double floor_s) {
  std::vector<double> rss(static_cast<std::size_t>(w.size()));
  allgather(&mine, 1, rss.data(), DType::f64, w);
  if (w.rank() != 0) return;
  for (int r = 0; r < w.size(); ++r)
    std::printf("%s,%s,%s,%d,%.1f,%.4f,%.4f\n", o.phase.c_str(), layout_name(o).c_str(), o.from.c_str(), r,
                rss[static_cast<std::size_t>(r)], seconds, floor_s);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Options o;
  CLI::App app{"resume cost per rank: peak RSS training vs resuming, and the resume time"};
  app.add_option("--phase", o.phase, "prepare | train | write | resume")->required();
  app.add_option("--dir", o.dir, "work directory (data, checkpoints)")->required();
  app.add_option("--from", o.from, "resume: the checkpoint directory's layout name (e.g. p4t1)");
  app.add_option("--pipeline", o.pipeline, "parallel.pipeline");
  app.add_option("--tensor", o.tensor, "parallel.tensor");
  app.add_option("--steps", o.steps, "optimizer steps (train, write)");
  app.add_option("--threads", o.threads, "compute threads per rank");
  app.add_option("--mnist", o.mnist, "Fashion-MNIST IDX directory (prepare)");
  CLI11_PARSE(app, argc, argv);
  Communicator world = Communicator::world();
  log::set_level(log::Level::warn);
  TrainerHooks h;
  h.evaluate = false;
  h.report = false;
  if (o.phase == "prepare") {
    data::PrepareOptions p;
    p.input = o.mnist;
    p.output = (fs::path(o.dir) / "data").string();
    p.name = "fashion-mnist";
    data::prepare_dataset(p, world);
  } else if (o.phase == "train" || o.phase == "write") {
    TrainConfig c = config(o);
    if (o.phase == "write") c.checkpoint.dir = (fs::path(o.dir) / layout_name(o)).string();
    Trainer t(c, world, h);
    world.barrier();
    const auto t0 = Clock::now();
    t.fit();
    world.barrier();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    print(o, world, peak_rss_mb(), s, 0);
  } else if (o.phase == "resume") {
    Trainer t(config(o), world, h);
    const std::string from = (fs::path(o.dir) / o.from).string();
    world.barrier();
    const auto t0 = Clock::now();
    t.resume(from);
    world.barrier();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count(), rss = peak_rss_mb();
    print(o, world, rss, s, read_floor_s(from, world));
  } else {
    if (world.rank() == 0) std::fprintf(stderr, "unknown --phase '%s'\n", o.phase.c_str());
    return 2;
  }
  return 0;
}
