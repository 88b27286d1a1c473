// Device-buffer all-reduce bus bandwidth (nccl-tests' busbw = bytes/t *
// 2(p-1)/p), ringtrain's ring on device buffers (pinned-staged pipeline, or
// CUDA-aware MPI when the library reports it) next to host-staged
// MPI_Allreduce (whole-message D2H, MPI_Allreduce, H2D) and, for context,
// MPI_Allreduce on host buffers. Run at 2 ranks:
//   mpirun -np 2 bench_gpu_allreduce [-b 4K] [-e 256M] [-f 4] [--iters 20] [--out r.json]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/tensor.hpp"
#include "ringtrain/cuda/collectives.hpp"
#include "ringtrain/cuda/context.hpp"
#include "ringtrain/cuda/kernels.hpp"

using namespace ringtrain;

namespace {

double median_time(const Communicator& comm, int iters, const std::function<void()>& f) {
  f();  // warm-up: staging slots, workspace
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    comm.barrier();
    double t0 = MPI_Wtime();
    f();
    double dt = MPI_Wtime() - t0, mx = 0;
    MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, comm.handle("bench"));
    t.push_back(mx);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  CLI::App app{"device-buffer all-reduce busbw"};
  std::string b = "4K", e = "256M", out;
  int factor = 4, iters = 20;
  app.add_option("-b,--begin", b, "smallest message");
  app.add_option("-e,--end", e, "largest message");
  app.add_option("-f,--factor", factor, "size multiplier")->check(CLI::Range(2, 64));
  app.add_option("--iters", iters, "timed iterations per size")->check(CLI::PositiveNumber);
  app.add_option("--out", out, "JSON results (rank 0)");
  CLI11_PARSE(app, argc, argv);
  Communicator comm = Communicator::world();
  if (!cuda::available()) {
    if (comm.rank() == 0) std::printf("SKIPPED: no CUDA device\n");
    return 0;  // not a failure: the benchmark has nothing to measure here
  }
  int dev = cuda::select_device(comm);
  cuda::CudaContext ctx(dev);
  cuda::DeviceCollectives dc(ctx);
  const int p = comm.size();
  const double bus = p > 1 ? 2.0 * (p - 1) / p : 1.0;
  std::size_t lo = parse_byte_size(b, "-b"), hi = parse_byte_size(e, "-e");
  if (comm.rank() == 0)
    std::printf("# %d ranks, device transport: %s\n# %12s %16s %16s %16s   (busbw GB/s)\n", p,
                dc.cuda_aware() ? "CUDA-aware MPI" : "pinned staging", "bytes", "rt ring (dev)", "staged MPI (dev)",
                "MPI (host)");
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t bytes = lo; bytes <= hi; bytes *= static_cast<std::size_t>(factor)) {
    std::size_t n = bytes / 4;
    Tensor d = Tensor::empty({static_cast<std::int64_t>(n)}, DType::f32, Device::cuda(dev));
    cuda::fill(d.raw(), n, DType::f32, 1.0, ctx.comm());
    std::vector<float> h(n, 1.0f);
    CollectiveOptions ring;
    ring.device = Device::cuda(dev);
    ring.algorithm = Algorithm::ring;
    CollectiveOptions staged = ring;
    staged.algorithm = Algorithm::mpi;
    double t_ring = median_time(comm, iters, [&] { dc.allreduce(d.raw(), d.raw(), n, DType::f32, ReduceOp::sum, comm, ring); });
    double t_mpi = median_time(comm, iters, [&] { dc.allreduce(d.raw(), d.raw(), n, DType::f32, ReduceOp::sum, comm, staged); });
    double t_host = median_time(comm, iters, [&] {
      MPI_Allreduce(MPI_IN_PLACE, h.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm.handle("bench"));
    });
    auto bw = [&](double t) { return static_cast<double>(bytes) / t * bus / 1e9; };
    if (comm.rank() == 0)
      std::printf("  %12zu %16.2f %16.2f %16.2f\n", bytes, bw(t_ring), bw(t_mpi), bw(t_host));
    rows.push_back({{"bytes", bytes}, {"ranks", p}, {"ring_device_s", t_ring}, {"staged_mpi_device_s", t_mpi},
                    {"mpi_host_s", t_host}, {"ring_device_busbw_gbs", bw(t_ring)},
                    {"staged_mpi_device_busbw_gbs", bw(t_mpi)}, {"mpi_host_busbw_gbs", bw(t_host)},
                    {"cuda_aware", dc.cuda_aware()}});
  }
  if (comm.rank() == 0 && !out.empty()) std::ofstream(out) << rows.dump(2) << "\n";
  return 0;
}
