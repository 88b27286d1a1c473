// Run by tests/hosts/run_mpi.sh across emulated hosts (RT_HOSTS = ranks per host,
// e.g. "2,1,1"): the node facts per emulated host, the automatic choice, and the
// bytes the hierarchical all-reduce sends across hosts against the minimum
// 2(N-1)/N n per node for N nodes, and every algorithm x dtype x op against
// MPI_Allreduce (a compact matrix: TCP between emulated hosts on 2 shared cores is
// slow for the thousands of calls of test_comm_mpi_allreduce).
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "comm/reference.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/shm.hpp"
#include "ringtrain/core/error.hpp"

using namespace ringtrain;

namespace {

std::vector<int> hosts_spec() {
  std::vector<int> v;
  const char* s = std::getenv("RT_HOSTS");
  if (!s) return v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::stoi(x));
  return v;
}

TEST(Hosts, NodeLocalRankAndSizePerEmulatedHost) {
  auto spec = hosts_spec();
  ASSERT_FALSE(spec.empty()) << "run me through tests/hosts/run_mpi.sh";
  auto comm = Communicator::world();
  // mpirun fills host 1 first, then host 2, ...: rank r's host and index follow from the spec.
  int r = comm.rank(), host = 0;
  while (r >= spec[host]) r -= spec[host++];
  EXPECT_EQ(comm.local_rank(), r);
  EXPECT_EQ(comm.local_size(), spec[host]);
  EXPECT_EQ(comm.node_count(), static_cast<int>(spec.size()));
  int most = 0;
  for (int n : spec) most = std::max(most, n);
  EXPECT_EQ(comm.max_local_size(), most);
  EXPECT_EQ(choose_algorithm(1 << 20, comm.size(), {}, comm.node_count(), comm.max_local_size()),
            most > 1 ? Algorithm::hierarchical : Algorithm::ring);
}

TEST(Hosts, ShmRefusesACommunicatorSpanningHosts) {
  auto comm = Communicator::world();
  float x = 1, y = 0;
  try {
    allreduce(&x, &y, 1, DType::f32, ReduceOp::sum, comm, {Algorithm::shm});
    ADD_FAILURE() << "shm across hosts did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shm needs every rank"), std::string::npos) << e.what();
  }
}

TEST(Hosts, HierarchicalSendsTheMinimumAcrossHosts) {
  auto comm = Communicator::world();
  MPI_Comm local;
  MPI_Comm_split_type(comm.handle(), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL, &local);
  const std::size_t n = 3 << 20;  // 12 MiB of f32: many chunks
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>((i + comm.rank()) % 7);
  allreduce(x.data(), x.data(), 16, DType::f32, ReduceOp::sum, comm, {Algorithm::hierarchical});  // set up
  std::size_t before = cross_node_bytes_sent(comm);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>((i + comm.rank()) % 7);
  allreduce(x.data(), x.data(), n, DType::f32, ReduceOp::sum, comm, {Algorithm::hierarchical});
  double mine = static_cast<double>(cross_node_bytes_sent(comm) - before), node = 0;
  MPI_Allreduce(&mine, &node, 1, MPI_DOUBLE, MPI_SUM, local);
  MPI_Comm_free(&local);
  double N = comm.node_count(), want = 2 * (N - 1) / N * static_cast<double>(n * sizeof(float));
  EXPECT_GE(node, 0.999 * want) << "bytes this node sent across hosts";
  EXPECT_LE(node, 1.01 * want) << "bytes this node sent across hosts";
  // And the result is right: sum over ranks of (i + rank) % 7.
  for (std::size_t i = 0; i < n; i += 9973) {
    float want_i = 0;
    for (int q = 0; q < comm.size(); ++q) want_i += static_cast<float>((i + q) % 7);
    ASSERT_EQ(x[i], want_i) << "element " << i;
  }
}

TEST(Hosts, EveryAlgorithmDtypeOpAgainstMpi) {
  using namespace rt_test;
  auto comm = Communicator::world();
  MPI_Comm h = comm.handle();
  const DType dtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8};
  const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max};
  const Algorithm algos[] = {Algorithm::ring, Algorithm::tree, Algorithm::mpi, Algorithm::hierarchical,
                             Algorithm::automatic};
  for (Algorithm a : algos)
    for (DType dt : dtypes)
      for (ReduceOp op : ops)
        {
          std::size_t count = 1003;  // not a multiple of any slice count
          bool in_place = op == ReduceOp::avg || op == ReduceOp::max;
          std::string what = cat(algorithm_name(a), " ", dtype_name(dt), " ", op_name(op), " count=", count);
          SCOPED_TRACE(what);
          auto in = make_data(dt, count, comm.rank(), static_cast<unsigned>(count));
          Expected e = reference_allreduce(in.data(), count, dt, op, h);
          std::vector<unsigned char> out(in.size(), 0xAB);
          if (in_place) out = in;
          allreduce(in_place ? out.data() : in.data(), out.data(), count, dt, op, comm, {a});
          expect_matches(out.data(), e, count, dt, op, comm.size(), what.c_str());
          expect_bitwise_equal_across(out.data(), count * dtype_size(dt), h, what.c_str());
        }
  // Large, several chunks and uneven slices, for the bandwidth paths.
  for (Algorithm a : {Algorithm::ring, Algorithm::hierarchical}) {
    std::size_t count = (1u << 20) + 3;
    std::string what = cat(algorithm_name(a), " f32 avg count=", count);
    auto in = make_data(DType::f32, count, comm.rank(), 5);
    Expected e = reference_allreduce(in.data(), count, DType::f32, ReduceOp::avg, h);
    allreduce(in.data(), in.data(), count, DType::f32, ReduceOp::avg, comm, {a});
    expect_matches(in.data(), e, count, DType::f32, ReduceOp::avg, comm.size(), what.c_str());
    expect_bitwise_equal_across(in.data(), count * 4, h, what.c_str());
  }
}

}  // namespace
