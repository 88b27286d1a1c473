// nccl-tests style all-reduce sweep: for each size, the median (over iterations)
// of the max-over-ranks time, algbw = bytes / time and busbw = algbw * 2(p-1)/p,
// for ringtrain's ring, tree, shm, hierarchical and automatic choice and for
// MPI_Allreduce, side by side, plus ring/mpi and shm/mpi busbw and auto/mpi time
// ratios. The same table goes to CSV.
// Physical bound of shm (one node): the bytes each rank must read and write when
// inputs and outputs are private memory -- publish the slices the peers reduce
// (R + W (p-1)n/p), reduce its own slice from the p inputs into its output and
// into shared memory (R n + W 2n/p), copy the other slices out (R + W (p-1)n/p):
// (5p-2)/p n bytes -- over the single-core memcpy rate measured at the start of
// this run (a copy of n bytes reads n and writes n): bound = (5p-2)/(2p) n / rate.
// Across nodes (hierarchical): bytes each node sent to other nodes, counted by the
// algorithm, against the minimum 2(N-1)/N n per node for N nodes.
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

#include <cstring>
#include <memory>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/shm.hpp"
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
                            const Communicator& comm, int warmup, int iters, bool do_check, bool use_min,
                            long long tree_threshold) {
  MPI_Comm h = comm.handle();
  int p = comm.size();
  std::size_t k = algos.size();
  auto run = [&](std::size_t a) {
    CollectiveOptions opt;
    opt.algorithm = algos[a];
    opt.tree_threshold = tree_threshold;
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

// Single-core memcpy rate (bytes copied per second) on `bytes`-sized buffers:
// rank 0 copies while the others wait; the median of 9 copies, shared with all.
double memcpy_rate(std::size_t bytes, MPI_Comm comm) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  double rate = 0;
  MPI_Barrier(comm);
  if (rank == 0) {
    std::vector<char> a(bytes, 1), b(bytes, 2);  // pages touched before timing
    std::vector<double> ts;
    for (int i = 0; i < 10; ++i) {
      double t0 = MPI_Wtime();
      std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes);
      if (i > 0) ts.push_back(MPI_Wtime() - t0);
    }
    std::nth_element(ts.begin(), ts.begin() + ts.size() / 2, ts.end());
    rate = static_cast<double>(bytes) / ts[ts.size() / 2];
  }
  MPI_Bcast(&rate, 1, MPI_DOUBLE, 0, comm);
  return rate;
}

// Bytes this node sent across nodes in one hierarchical all-reduce of `count`.
double node_cross_bytes(const std::vector<unsigned char>& in, std::vector<unsigned char>& out, std::size_t count,
                        DType t, ReduceOp op, const Communicator& comm) {
  CollectiveOptions o{Algorithm::hierarchical};
  allreduce(in.data(), out.data(), count, t, op, comm, o);
  std::size_t before = cross_node_bytes_sent(comm);
  allreduce(in.data(), out.data(), count, t, op, comm, o);
  double mine = static_cast<double>(cross_node_bytes_sent(comm) - before), node = 0;
  MPI_Comm local;
  MPI_Comm_split_type(comm.handle(), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL, &local);
  MPI_Allreduce(&mine, &node, 1, MPI_DOUBLE, MPI_SUM, local);
  MPI_Comm_free(&local);
  double most = 0;
  MPI_Allreduce(&node, &most, 1, MPI_DOUBLE, MPI_MAX, comm.handle());
  return most;
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  CLI::App app{"ringtrain all-reduce sweep (nccl-tests style)"};
  std::string b = "8", e = "256M", dt = "float32", opname = "sum", csv, algos_s = "ring,tree,shm,hierarchical,auto,mpi";
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
  app.add_option("--algos", algos_s, "comma-separated subset of ring,tree,shm,hierarchical,auto,mpi (shm is dropped on several nodes)");
  app.add_option("--stat", stat, "statistic over iterations: median or min")
      ->check(CLI::IsMember({"median", "min"}));
  app.add_option("--tree-threshold", threshold, "automatic's tree/ring cut-over in bytes (default: built-in)");
  CLI11_PARSE(app, argc, argv);

  auto comm = Communicator::world();
  int p = comm.size(), rank = comm.rank();
  try {
    DType t = parse_dtype(dt);
    ReduceOp op = parse_op(opname);
    std::size_t lo = parse_byte_size(b, "-b"), hi = parse_byte_size(e, "-e");
    std::vector<Algorithm> algos;
    std::stringstream ss(algos_s);
    const int nodes = comm.node_count();
    for (std::string s; std::getline(ss, s, ',');) {
      Algorithm a = parse_algorithm(s);
      if (a == Algorithm::shm && nodes > 1) continue;  // shm serves one node only
      algos.push_back(a);
    }
    std::size_t es = dtype_size(t);
    auto idx = [&](Algorithm a) { return std::find(algos.begin(), algos.end(), a) - algos.begin(); };
    auto has = [&](Algorithm a) { return idx(a) < static_cast<long>(algos.size()); };
    bool have_mpi = has(Algorithm::mpi);
    const bool bound = has(Algorithm::shm) && p > 1;
    const bool cross = has(Algorithm::hierarchical) && nodes > 1;
    const double rate = bound ? memcpy_rate(std::min<std::size_t>(hi, 64 << 20), comm.handle()) : 0;
    std::vector<double> shm_mpi, shm_ring, shm_bound, hier_mpi, hier_ring;
    double small_worst = 0;

    std::ofstream out;
    CollectiveOptions cut;
    cut.tree_threshold = threshold;
    if (rank == 0) {
      std::printf("# ringtrain all-reduce sweep: %d ranks, %s %s, warmup %d, iters %d, tree threshold %lld B\n", p,
                  dtype_name(t), op_name(op), warmup, iters, effective_tree_threshold(cut));
      std::printf("# time = %s over iterations of the slowest rank (us); bw in GB/s; %d node(s), at most %d "
                  "ranks on one\n", stat.c_str(), nodes, comm.max_local_size());
      if (bound)
        std::printf("# single-core memcpy %.2f GB/s (copied bytes/s); shm bound = (5p-2)/(2p) * bytes / memcpy\n",
                    rate / 1e9);
      if (cross)
        std::printf("# cross-node bytes per node: hierarchical counted, minimum 2(N-1)/N n, ring (model) "
                    "2(p-1)/p n\n");
      std::printf("%12s %10s", "bytes", "count");
      for (Algorithm a : algos) std::printf(" | %5s %10s %7s %7s%s", algorithm_name(a), "time", "algbw", "busbw", do_check ? "  chk" : "");
      if (have_mpi) std::printf(" | %9s %9s %9s", "ring/mpi", nodes > 1 ? "hier/mpi" : "shm/mpi", "auto/mpi");
      if (bound) std::printf(" | %9s %8s", "bound_us", "shm/bnd");
      if (cross) std::printf(" | %11s %11s %11s", "hier_xbytes", "min_xbytes", "ring_xbytes");
      std::printf("\n");
      if (!csv.empty()) {
        out.open(csv);
        RT_CHECK(out.good(), "--csv: cannot write '", csv, "'");
        out.precision(12);  // byte counts stay exact
        out << "ranks,nodes,dtype,op,bytes,count,algorithm,resolved,time_us,algbw_GBps,busbw_GBps,check,"
               "memcpy_GBps,bound_us,cross_bytes_per_node,min_cross_bytes_per_node\n";
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
      auto rs = measure(algos, in, res, count, t, op, comm, warmup, iters, do_check, stat == "min", threshold);
      double n = static_cast<double>(count * es);
      double bound_us = bound ? (5.0 * p - 2.0) / (2.0 * p) * n / rate * 1e6 : 0;
      double xbytes = cross ? node_cross_bytes(in, res, count, t, op, comm) : 0;
      double xmin = 2.0 * (nodes - 1) / nodes * n;
      if (rank != 0) continue;
      std::printf("%12zu %10zu", count * es, count);
      for (std::size_t i = 0; i < algos.size(); ++i) {
        std::printf(" | %5s %10.1f %7.3f %7.3f%s", "", rs[i].us, rs[i].algbw, rs[i].busbw,
                    do_check ? (rs[i].ok ? "   ok" : " FAIL") : "");
        if (out.is_open()) {
          CollectiveOptions o{algos[i]};
          o.tree_threshold = threshold;
          bool sh = algos[i] == Algorithm::shm, hr = algos[i] == Algorithm::hierarchical;
          out << p << ',' << nodes << ',' << dtype_name(t) << ',' << op_name(op) << ',' << count * es << ',' << count
              << ',' << algorithm_name(algos[i]) << ','
              << algorithm_name(choose_algorithm(count * es, p, o, nodes, comm.max_local_size())) << ','
              << rs[i].us << ',' << rs[i].algbw << ',' << rs[i].busbw << ','
              << (do_check ? (rs[i].ok ? "ok" : "FAIL") : "") << ',' << (bound ? rate / 1e9 : 0) << ','
              << (sh && bound ? bound_us : 0) << ',' << (hr && cross ? xbytes : 0) << ','
              << (hr && cross ? xmin : 0) << '\n';
        }
      }
      if (have_mpi) {
        const Result& m = rs[idx(Algorithm::mpi)];
        auto ratio = [&](Algorithm a, bool bw) {
          std::size_t i = idx(a);
          if (i >= algos.size()) return std::nan("");
          return bw ? rs[i].busbw / m.busbw : rs[i].us / m.us;
        };
        std::printf(" | %9.2f %9.2f %9.2f", ratio(Algorithm::ring, true),
                    ratio(nodes > 1 ? Algorithm::hierarchical : Algorithm::shm, true),
                    ratio(Algorithm::automatic, false));
        const double mib = 1 << 20;
        if (n >= mib && n <= 64 * mib) {
          if (has(Algorithm::shm)) shm_mpi.push_back(ratio(Algorithm::shm, true));
          if (has(Algorithm::hierarchical)) hier_mpi.push_back(ratio(Algorithm::hierarchical, true));
        }
        if (n <= 4096 && has(Algorithm::shm)) small_worst = std::max(small_worst, ratio(Algorithm::shm, false));
      }
      if (has(Algorithm::ring) && n >= (1 << 20) && n <= (64 << 20)) {
        double ring_bw = rs[idx(Algorithm::ring)].busbw;
        if (has(Algorithm::shm)) shm_ring.push_back(rs[idx(Algorithm::shm)].busbw / ring_bw);
        if (has(Algorithm::hierarchical)) hier_ring.push_back(rs[idx(Algorithm::hierarchical)].busbw / ring_bw);
      }
      if (bound) {
        double r = rs[idx(Algorithm::shm)].us / bound_us;
        std::printf(" | %9.1f %8.2f", bound_us, r);
        if (n >= (1 << 20)) shm_bound.push_back(r);
      }
      if (cross) std::printf(" | %11.0f %11.0f %11.0f", xbytes, xmin, 2.0 * (p - 1) / p * n);
      std::printf("\n");
      std::fflush(stdout);
    }
    if (rank == 0) {
      std::printf("# summary over 1-64 MiB (medians): shm/mpi busbw %.2f, shm/ring busbw %.2f, hierarchical/mpi "
                  "busbw %.2f, hierarchical/ring busbw %.2f\n",
                  median(shm_mpi), median(shm_ring), median(hier_mpi), median(hier_ring));
      if (has(Algorithm::shm) && have_mpi)
        std::printf("# shm time / MPI time, worst over sizes <= 4 KiB: %.2f\n", small_worst);
      if (bound) std::printf("# shm time / memory-traffic bound, median over sizes >= 1 MiB: %.2f\n", median(shm_bound));
    }
  } catch (const Error& err) {
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, err.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 0;
}
