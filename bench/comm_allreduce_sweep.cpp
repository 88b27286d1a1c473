// nccl-tests style all-reduce sweep: for each size, the median (over iterations)
// of the max-over-ranks time, algbw = bytes / time and busbw = algbw * 2(p-1)/p,
// for ringtrain's ring, tree and automatic choice and for MPI_Allreduce, side by
// side, plus ring/mpi busbw and auto/mpi time ratios. The same table goes to CSV.
//   mpirun -np 2 bench_comm_allreduce_sweep -b 8 -e 256M -f 4 [-w 5 -n 20 -c 1 -d float32 -o sum --stat median|min]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/error.hpp"

using namespace ringtrain;

namespace {

struct Result {
  double us = 0, algbw = 0, busbw = 0;
  bool ok = true;
};

// Small integers: every sum is exact in every dtype, so -c can compare exactly.
void fill(std::vector<unsigned char>& buf, DType t, std::size_t count, int rank) {
  dispatch_dtype(t, [&](auto z) {
    using T = decltype(z);
    T* p = reinterpret_cast<T*>(buf.data());
    for (std::size_t i = 0; i < count; ++i) {
      float v = static_cast<float>((i + rank) % 5);
      if constexpr (std::is_same_v<T, float16>) p[i] = to_f16(v);
      else if constexpr (std::is_same_v<T, bfloat16>) p[i] = to_bf16(v);
      else p[i] = static_cast<T>(v);
    }
  });
}

bool check(const std::vector<unsigned char>& out, DType t, ReduceOp op, std::size_t count, int p) {
  bool ok = true;
  dispatch_dtype(t, [&](auto z) {
    using T = decltype(z);
    const T* q = reinterpret_cast<const T*>(out.data());
    for (std::size_t i = 0; i < count && ok; i += 1 + count / 4096) {
      double want = op == ReduceOp::min ? 1e300 : op == ReduceOp::max ? -1e300 : 0;
      for (int r = 0; r < p; ++r) {
        double v = static_cast<double>((i + r) % 5);
        want = op == ReduceOp::min ? std::min(want, v) : op == ReduceOp::max ? std::max(want, v) : want + v;
      }
      if (op == ReduceOp::avg) want = is_floating(t) ? want / p : std::trunc(want / p);
      double got;
      if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) got = to_f32(q[i]);
      else got = static_cast<double>(q[i]);
      ok = std::fabs(got - want) <= 1e-2 * std::fabs(want) + 1e-6;
    }
  });
  return ok;
}

// Times every algorithm on the same message, interleaved iteration by iteration
// (a, b, c, a, b, c, ...), so that load from other processes on a shared machine
// hits all of them alike and their ratios stay meaningful.
std::vector<Result> measure(const std::vector<Algorithm>& algos, const std::vector<unsigned char>& in,
                            std::vector<unsigned char>& out, std::size_t count, DType t, ReduceOp op,
                            const Communicator& comm, int warmup, int iters, bool do_check, bool use_min) {
  MPI_Comm h = comm.handle();
  int p = comm.size();
  std::size_t k = algos.size();
  auto run = [&](std::size_t a) {
    CollectiveOptions opt;
    opt.algorithm = algos[a];
    allreduce(in.data(), out.data(), count, t, op, comm, opt);
  };
  for (int i = 0; i < warmup; ++i)
    for (std::size_t a = 0; a < k; ++a) run(a);
  std::vector<double> times(k * iters);
  for (int i = 0; i < iters; ++i)
    for (std::size_t a = 0; a < k; ++a) {
      MPI_Barrier(h);
      double t0 = MPI_Wtime();
      run(a);
      times[a * iters + i] = MPI_Wtime() - t0;
    }
  MPI_Allreduce(MPI_IN_PLACE, times.data(), static_cast<int>(times.size()), MPI_DOUBLE, MPI_MAX, h);  // slowest rank
  std::vector<Result> rs(k);
  double bytes = static_cast<double>(count * dtype_size(t));
  for (std::size_t a = 0; a < k; ++a) {
    auto b = times.begin() + a * iters;
    // min: the uncontended cost (what a cost model fits on a shared, loaded machine).
    std::nth_element(b, b + (use_min ? 0 : iters / 2), b + iters);
    double s = b[use_min ? 0 : iters / 2];
    rs[a].us = s * 1e6;
    rs[a].algbw = bytes / s / 1e9;
    rs[a].busbw = rs[a].algbw * 2.0 * (p - 1) / p;
    if (do_check) {
      std::fill(out.begin(), out.end(), 0);
      run(a);
      int ok = check(out, t, op, count, p) ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, h);
      rs[a].ok = ok;
    }
  }
  return rs;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  CLI::App app{"ringtrain all-reduce sweep (nccl-tests style)"};
  std::string b = "8", e = "256M", dt = "float32", opname = "sum", csv, algos_s = "ring,tree,auto,mpi";
  int f = 4, warmup = 5, iters = 20, do_check = 1;
  long long threshold = -1;
  std::string stat = "median";
  app.add_option("-b,--minbytes", b, "smallest message (K/M/G suffixes)");
  app.add_option("-e,--maxbytes", e, "largest message");
  app.add_option("-f,--stepfactor", f, "size multiplier between steps")->check(CLI::Range(2, 1 << 20));
  app.add_option("-w,--warmup_iters", warmup, "untimed iterations per size and algorithm");
  app.add_option("-n,--iters", iters, "timed iterations (median reported)")->check(CLI::Range(1, 1 << 20));
  app.add_option("-c,--check", do_check, "verify results (0/1)");
  app.add_option("-d,--datatype", dt, "float32, float64, float16, bfloat16, int32, int64");
  app.add_option("-o,--op", opname, "sum, avg, min, max");
  app.add_option("--csv", csv, "also write the table to this CSV file");
  app.add_option("--algos", algos_s, "comma-separated subset of ring,tree,auto,mpi");
  app.add_option("--stat", stat, "statistic over iterations: median or min")
      ->check(CLI::IsMember({"median", "min"}));
  app.add_option("--tree-threshold", threshold, "automatic's tree/ring cut-over in bytes (default: built-in/env)");
  CLI11_PARSE(app, argc, argv);

  auto comm = Communicator::world();
  int p = comm.size(), rank = comm.rank();
  try {
    DType t = parse_dtype(dt);
    ReduceOp op = parse_op(opname);
    std::size_t lo = parse_byte_size(b, "-b"), hi = parse_byte_size(e, "-e");
    std::vector<Algorithm> algos;
    std::stringstream ss(algos_s);
    for (std::string s; std::getline(ss, s, ',');) algos.push_back(parse_algorithm(s));
    if (threshold >= 0) setenv("RINGTRAIN_TREE_THRESHOLD", std::to_string(threshold).c_str(), 1);
    std::size_t es = dtype_size(t);
    auto idx = [&](Algorithm a) { return std::find(algos.begin(), algos.end(), a) - algos.begin(); };
    bool have_mpi = idx(Algorithm::mpi) < static_cast<long>(algos.size());

    std::ofstream out;
    if (rank == 0) {
      std::printf("# ringtrain all-reduce sweep: %d ranks, %s %s, warmup %d, iters %d, tree threshold %lld B\n", p,
                  dtype_name(t), op_name(op), warmup, iters, effective_tree_threshold({}));
      std::printf("# time = %s over iterations of the slowest rank (us); bw in GB/s\n", stat.c_str());
      std::printf("%12s %10s", "bytes", "count");
      for (Algorithm a : algos) std::printf(" | %5s %10s %7s %7s%s", algorithm_name(a), "time", "algbw", "busbw", do_check ? "  chk" : "");
      if (have_mpi) std::printf(" | %9s %9s", "ring/mpi", "auto/mpi");
      std::printf("\n");
      if (!csv.empty()) {
        out.open(csv);
        RT_CHECK(out.good(), "--csv: cannot write '", csv, "'");
        out << "ranks,dtype,op,bytes,count,algorithm,resolved,time_us,algbw_GBps,busbw_GBps,check\n";
      }
    }
    // The -b * f^k sizes, and -e itself as the last point when the steps skip it.
    std::vector<std::size_t> sizes;
    for (std::size_t bytes = lo; bytes <= hi; bytes *= f) sizes.push_back(bytes);
    if (sizes.empty() || sizes.back() != hi) sizes.push_back(hi);
    for (std::size_t bytes : sizes) {
      std::size_t count = std::max<std::size_t>(1, bytes / es);
      std::vector<unsigned char> in(count * es), res(count * es);
      fill(in, t, count, rank);
      auto rs = measure(algos, in, res, count, t, op, comm, warmup, iters, do_check, stat == "min");
      if (rank != 0) continue;
      std::printf("%12zu %10zu", count * es, count);
      for (std::size_t i = 0; i < algos.size(); ++i) {
        std::printf(" | %5s %10.1f %7.3f %7.3f%s", "", rs[i].us, rs[i].algbw, rs[i].busbw,
                    do_check ? (rs[i].ok ? "   ok" : " FAIL") : "");
        if (out.is_open()) {
          CollectiveOptions o{algos[i]};
          out << p << ',' << dtype_name(t) << ',' << op_name(op) << ',' << count * es << ',' << count << ','
              << algorithm_name(algos[i]) << ',' << algorithm_name(choose_algorithm(count * es, p, o)) << ','
              << rs[i].us << ',' << rs[i].algbw << ',' << rs[i].busbw << ','
              << (do_check ? (rs[i].ok ? "ok" : "FAIL") : "") << '\n';
        }
      }
      if (have_mpi) {
        const Result& m = rs[idx(Algorithm::mpi)];
        auto ratio = [&](Algorithm a, bool bw) {
          std::size_t i = idx(a);
          if (i >= algos.size()) return std::nan("");
          return bw ? rs[i].busbw / m.busbw : rs[i].us / m.us;
        };
        std::printf(" | %9.2f %9.2f", ratio(Algorithm::ring, true), ratio(Algorithm::automatic, false));
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  } catch (const Error& err) {
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, err.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 0;
}
