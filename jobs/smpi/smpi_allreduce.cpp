// ringtrain's own all-reduce (src/comm: ring and recursive doubling over the primitives and
// MpiTransport) under SimGrid's SMPI: every rank is simulated on a platform file of a cluster,
// so times are those of the simulated network. Built with smpicxx by jobs/smpi/run.sh.
//   smpirun -np 64 -platform cluster.xml -hostfile hosts smpi_allreduce 4096 65536 1048576
// Prints CSV lines: ranks,algorithm,bytes,time_us (slowest rank). The simulation is deterministic,
// so each point runs once, after one untimed call that sets up the communicator's context.
// SMPI_ALGOS: comma-separated subset of ring,tree (default both).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/error.hpp"

using namespace ringtrain;

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  // No timeout: the transport's polls advance simulated time only a little.
  auto comm = Communicator::world(0);
  const int p = comm.size();
  const int iters = std::getenv("SMPI_ITERS") ? std::atoi(std::getenv("SMPI_ITERS")) : 1;
  const std::string algos = std::getenv("SMPI_ALGOS") ? std::getenv("SMPI_ALGOS") : "ring,tree";
  try {
    {
      float x = 1.0f, y = 0.0f;
      CollectiveOptions opt;
      opt.algorithm = Algorithm::tree;
      allreduce(&x, &y, 1, DType::f32, ReduceOp::sum, comm, opt);
    }
    for (int a = 1; a < argc; ++a) {
      std::size_t bytes = parse_byte_size(argv[a], "size");
      std::size_t count = std::max<std::size_t>(1, bytes / 4);
      std::vector<float> in(count, 1.0f + comm.rank()), out(count);
      for (Algorithm algo : {Algorithm::ring, Algorithm::tree}) {
        if (algos.find(algorithm_name(algo)) == std::string::npos) continue;
        CollectiveOptions opt;
        opt.algorithm = algo;
        std::vector<double> ts;
        for (int i = 0; i < iters; ++i) {
          MPI_Barrier(comm.handle());
          double t0 = MPI_Wtime();
          allreduce(in.data(), out.data(), count, DType::f32, ReduceOp::sum, comm, opt);
          double t = MPI_Wtime() - t0;
          MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm.handle());
          ts.push_back(t);
        }
        // Every element is the sum 1 + 2 + ... + p: check one, so a wrong simulation cannot pass.
        const float want = 0.5f * p * (p + 1);
        RT_CHECK(out[count / 2] == want, "all-reduce result ", out[count / 2], " != ", want);
        std::sort(ts.begin(), ts.end());
        if (comm.rank() == 0)
          std::printf("%d,%s,%zu,%.3f\n", p, algorithm_name(algo), count * 4, ts[ts.size() / 2] * 1e6);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "[rank %d] error: %s\n", comm.rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 0;
}
