// The flight recorder's cost (comm/flight_recorder.hpp) on small all-reduces,
// where a fixed per-operation cost shows most: for each size and algorithm,
// the same allreduce() with recording suspended, on, and suspended again,
// interleaved iteration by iteration (off, on, off2, off, on, off2, ...) so that
// load from other processes hits all alike; the median over iterations of the
// slowest rank's time, the ratio on/off, and off2/off: what two identical
// settings differ by in this run (the noise). Beside it the bound: the recorder's own cost per operation,
// measured first by recording `--calls` operations in a loop on one rank
// (ns per operation), as a fraction of the all-reduce's time.
//   mpirun -np 2 bench_comm_flight_recorder_overhead -b 8 -e 64K -f 4 [-n 200 --algos tree,ring,auto]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/flight_recorder.hpp"
#include "ringtrain/core/error.hpp"

using namespace ringtrain;

namespace {

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  CLI::App app{"flight recorder overhead on small all-reduces"};
  std::string b = "8", e = "64K", algos_s = "tree,ring,auto";
  int f = 4, warmup = 20, iters = 200, calls = 1000000;
  app.add_option("-b,--minbytes", b, "smallest message");
  app.add_option("-e,--maxbytes", e, "largest message");
  app.add_option("-f,--stepfactor", f, "size multiplier between steps")->check(CLI::Range(2, 1 << 20));
  app.add_option("-w,--warmup_iters", warmup, "untimed iterations per size and setting");
  app.add_option("-n,--iters", iters, "timed iterations per setting (median reported)")->check(CLI::Range(1, 1 << 24));
  app.add_option("--calls", calls, "operations recorded for the per-operation cost")->check(CLI::Range(1, 1 << 30));
  app.add_option("--algos", algos_s, "comma-separated all-reduce algorithms");
  CLI11_PARSE(app, argc, argv);
  auto comm = Communicator::world();
  const int p = comm.size(), rank = comm.rank();
  MPI_Comm h = comm.handle();
  try {
    flight_recorder::configure("", 1024);  // records, writes nothing
    std::vector<Algorithm> algos;
    std::stringstream ss(algos_s);
    for (std::string s; std::getline(ss, s, ',');) algos.push_back(parse_algorithm(s));
    // The recorder alone: one Op per iteration on this communicator.
    double t0 = MPI_Wtime();
    for (int i = 0; i < calls; ++i) flight_recorder::Op rec(h, comm.name(), "allreduce", 8);
    double per_op = (MPI_Wtime() - t0) / calls;
    MPI_Allreduce(MPI_IN_PLACE, &per_op, 1, MPI_DOUBLE, MPI_MAX, h);
    if (rank == 0) {
      std::printf("# flight recorder overhead: %d ranks, 1024 entries, warmup %d, iters %d per setting, off/on "
                  "interleaved\n# one recorded operation costs %.1f ns (%d in a loop, slowest rank); bound = that "
                  "/ time off\n# time = median over iterations of the slowest rank (us)\n",
                  p, warmup, iters, per_op * 1e9, calls);
      std::printf("%10s %6s | %9s %9s %9s | %7s %8s | %7s\n", "bytes", "algo", "off_us", "on_us", "off2_us", "on/off",
                  "off2/off", "bound");
    }
    std::vector<double> ratios, noise;
    for (std::size_t bytes = parse_byte_size(b, "-b"); bytes <= parse_byte_size(e, "-e"); bytes *= f) {
      const std::size_t count = std::max<std::size_t>(1, bytes / 4);
      std::vector<float> in(count, 1.0f), out(count);
      for (Algorithm a : algos) {
        CollectiveOptions opt{a};
        auto run = [&] { allreduce(in.data(), out.data(), count, DType::f32, ReduceOp::sum, comm, opt); };
        std::vector<double> t(3 * static_cast<std::size_t>(iters));
        for (int i = -warmup; i < iters; ++i)
          for (int on = 0; on < 3; ++on) {
            flight_recorder::suspend(on != 1);
            MPI_Barrier(h);
            const double s = MPI_Wtime();
            run();
            if (i >= 0) t[static_cast<std::size_t>(on * iters + i)] = MPI_Wtime() - s;
          }
        flight_recorder::suspend(false);
        MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX, h);
        const double off = median({t.begin(), t.begin() + iters}),
                     on = median({t.begin() + iters, t.begin() + 2 * iters}), off2 = median({t.begin() + 2 * iters, t.end()});
        ratios.push_back(on / off);
        noise.push_back(off2 / off);
        if (rank == 0)
          std::printf("%10zu %6s | %9.2f %9.2f %9.2f | %7.3f %8.3f | %7.4f\n", count * 4, algorithm_name(a), off * 1e6,
                      on * 1e6, off2 * 1e6, on / off, off2 / off, per_op / off);
      }
    }
    if (rank == 0)
      std::printf("# over all rows: on/off median %.3f (min %.3f, max %.3f); off2/off median %.3f (min %.3f, max %.3f)\n",
                  median(ratios), *std::min_element(ratios.begin(), ratios.end()),
                  *std::max_element(ratios.begin(), ratios.end()), median(noise),
                  *std::min_element(noise.begin(), noise.end()), *std::max_element(noise.begin(), noise.end()));
  } catch (const Error& err) {
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, err.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 0;
}
