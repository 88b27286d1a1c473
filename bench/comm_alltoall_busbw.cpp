// All-to-all bus bandwidth (nccl-tests conventions): for each size (the bytes
// one rank sends, all blocks together), the median over iterations of the
// slowest rank's time, algbw = bytes / time and
//   busbw = bytes (p-1)/p / time
// (each rank's own block never crosses a link), for ringtrain's alltoall and
// MPI_Alltoall, then alltoallv with uneven blocks (a third of them empty) and
// MPI_Alltoallv on the same counts; interleaved iteration by iteration so that
// load from other processes hits both alike, with the ratio ours/MPI.
// Bound beside each figure: one copy of the bytes that cross, at the
// single-core memcpy rate of a buffer of that size measured in the same run
// (in cache for small sizes, from memory for large): bytes (p-1)/p / memcpy; the
// ratio time/bound says how far from it each is (with fewer cores than ranks,
// ranks also queue for a core, which the bound ignores).
//   mpirun -np 4 bench_comm_alltoall_busbw -b 1K -e 64M -f 4 [-w 5 -n 20]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ringtrain/comm/alltoall.hpp"
#include "ringtrain/core/error.hpp"

using namespace ringtrain;

namespace {

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Single-core memcpy rate (bytes copied per second): rank 0 copies, the median of 9.
double memcpy_rate(std::size_t bytes, MPI_Comm comm) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  double rate = 0;
  MPI_Barrier(comm);
  if (rank == 0) {
    std::vector<char> a(bytes, 1), b(bytes, 2);
    std::vector<double> ts;
    for (int i = 0; i < 10; ++i) {
      double t0 = MPI_Wtime();
      std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes);
      if (i > 0) ts.push_back(MPI_Wtime() - t0);
    }
    rate = static_cast<double>(bytes) / median(ts);
  }
  MPI_Bcast(&rate, 1, MPI_DOUBLE, 0, comm);
  return rate;
}

// Times each of `fns` (interleaved), the slowest rank's time per iteration; the median per fn.
std::vector<double> measure(const std::vector<std::function<void()>>& fns, MPI_Comm h, int warmup, int iters) {
  const std::size_t k = fns.size();
  for (int i = 0; i < warmup; ++i)
    for (auto& f : fns) f();
  std::vector<double> t(k * iters);
  for (int i = 0; i < iters; ++i)
    for (std::size_t a = 0; a < k; ++a) {
      MPI_Barrier(h);
      double t0 = MPI_Wtime();
      fns[a]();
      t[a * iters + i] = MPI_Wtime() - t0;
    }
  MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX, h);
  std::vector<double> out(k);
  for (std::size_t a = 0; a < k; ++a) out[a] = median({t.begin() + a * iters, t.begin() + (a + 1) * iters});
  return out;
}

// Bytes rank i sends rank j in the uneven case: 0, 1 or 2 units (mean 1).
std::size_t uneven(int i, int j, std::size_t unit) { return static_cast<std::size_t>((i + 2 * j) % 3) * unit; }

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  CLI::App app{"ringtrain all-to-all bus bandwidth vs MPI_Alltoall(v)"};
  std::string b = "1K", e = "64M";
  int f = 4, warmup = 5, iters = 20;
  app.add_option("-b,--minbytes", b, "smallest per-rank send buffer (K/M/G suffixes)");
  app.add_option("-e,--maxbytes", e, "largest per-rank send buffer");
  app.add_option("-f,--stepfactor", f, "size multiplier between steps")->check(CLI::Range(2, 1 << 20));
  app.add_option("-w,--warmup_iters", warmup, "untimed iterations per size");
  app.add_option("-n,--iters", iters, "timed iterations (median reported)")->check(CLI::Range(1, 1 << 20));
  CLI11_PARSE(app, argc, argv);
  auto comm = Communicator::world();
  const int p = comm.size(), rank = comm.rank();
  MPI_Comm h = comm.handle();
  try {
    const std::size_t lo = parse_byte_size(b, "-b"), hi = parse_byte_size(e, "-e");
    if (rank == 0) {
      std::printf(
          "# ringtrain all-to-all: %d ranks, warmup %d, iters %d; time = median over iterations of the "
          "slowest rank (us)\n# busbw = bytes (p-1)/p / time (GB/s); bytes = one rank's send buffer "
          "(alltoallv: the mean over ranks)\n# bound = bytes (p-1)/p / memcpy, single-core memcpy "
          "of `bytes` measured before each size; x/bnd = time / bound\n",
          p, warmup, iters);
      std::printf("%-9s %11s | %10s %7s | %10s %7s | %8s | %9s %7s %7s | %s\n", "op", "bytes", "ours_us", "busbw",
                  "mpi_us", "busbw", "ours/mpi", "bound_us", "ours/bnd", "mpi/bnd", "check");
    }
    std::vector<std::size_t> sizes;
    for (std::size_t bytes = lo; bytes <= hi; bytes *= f) sizes.push_back(bytes);
    for (std::size_t bytes : sizes) {
      const std::size_t unit = std::max<std::size_t>(1, bytes / p);  // one block, bytes
      const double rate = memcpy_rate(bytes, h);
      for (bool v : {false, true}) {
        std::vector<std::size_t> sc(p), rc(p);
        for (int j = 0; j < p; ++j) {
          sc[j] = v ? uneven(rank, j, unit) : unit;
          rc[j] = v ? uneven(j, rank, unit) : unit;
        }
        auto sd = packed_displs(sc), rd = packed_displs(rc);
        const std::size_t sn = sd.back() + sc.back(), rn = rd.back() + rc.back();
        std::vector<unsigned char> send(sn + 1), ours(rn + 1, 0), ref(rn + 1, 1);
        for (std::size_t i = 0; i < sn; ++i) send[i] = static_cast<unsigned char>(i * 131 + rank * 7);
        std::vector<int> isc(sc.begin(), sc.end()), isd(sd.begin(), sd.end()), irc(rc.begin(), rc.end()),
            ird(rd.begin(), rd.end());
        std::vector<std::function<void()>> fns;
        if (v) {
          fns.push_back([&] { alltoallv(send.data(), sc, sd, ours.data(), rc, rd, DType::u8, comm); });
          fns.push_back([&] {
            MPI_Alltoallv(send.data(), isc.data(), isd.data(), MPI_BYTE, ref.data(), irc.data(), ird.data(), MPI_BYTE,
                          h);
          });
        } else {
          fns.push_back([&] { alltoall(send.data(), ours.data(), unit, DType::u8, comm); });
          fns.push_back([&] {
            MPI_Alltoall(send.data(), static_cast<int>(unit), MPI_BYTE, ref.data(), static_cast<int>(unit), MPI_BYTE,
                         h);
          });
        }
        const auto t = measure(fns, h, warmup, iters);
        ours.back() = ref.back();  // the +1 guard byte is not data
        int ok = ours == ref ? 1 : 0;
        MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, h);
        double mean = static_cast<double>(sn);
        MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_DOUBLE, MPI_SUM, h);
        mean /= p;
        const double cross = mean * (p - 1) / p, bound = cross / rate;
        if (rank == 0)
          std::printf("%-9s %11.0f | %10.1f %7.3f | %10.1f %7.3f | %8.2f | %9.1f %7.2f %7.2f | %s\n",
                      v ? "alltoallv" : "alltoall", mean, t[0] * 1e6, cross / t[0] / 1e9, t[1] * 1e6,
                      cross / t[1] / 1e9, (cross / t[0]) / (cross / t[1]), bound * 1e6, t[0] / bound, t[1] / bound,
                      ok ? "ok (bitwise = MPI)" : "FAIL");
        std::fflush(stdout);
      }
    }
  } catch (const Error& err) {
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, err.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 0;
}
