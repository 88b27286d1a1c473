// The node-aware all-reduces (shm, hierarchical) against MPI_Allreduce with
// small slots, so that counts of a few thousand elements already run many
// double-buffered chunks, uneven slices and the one-round path; repeated calls
// that alternate the paths (the slot parity protocol); the node facts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "reference.hpp"
#include "ringtrain/comm/shm.hpp"

using namespace ringtrain;
using namespace rt_test;

namespace {

const DType kDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max};

void check(const Communicator& comm, Algorithm algo, DType dtype, ReduceOp op, std::size_t count, bool in_place,
           unsigned salt = 0) {
  MPI_Comm h = comm.handle();
  std::string what = std::string(algorithm_name(algo)) + " " + dtype_name(dtype) + " " + op_name(op) +
                     " count=" + std::to_string(count) + (in_place ? " in-place" : "") + " p=" +
                     std::to_string(comm.size());
  SCOPED_TRACE(what);
  auto in = make_data(dtype, count, comm.rank(), static_cast<unsigned>(count) + salt);
  const auto original = in;
  Expected e = reference_allreduce(in.data(), count, dtype, op, h);
  std::vector<unsigned char> out = in;
  if (!in_place) std::fill(out.begin(), out.end(), 0xAB);
  allreduce(in_place ? out.data() : in.data(), out.data(), count, dtype, op, comm, {algo});
  expect_matches(out.data(), e, count, dtype, op, comm.size(), what.c_str());
  expect_bitwise_equal_across(out.data(), count * dtype_size(dtype), h, what.c_str());
  if (!in_place) {
    EXPECT_TRUE(in == original) << "out-of-place all-reduce modified its input";
  }
}

// A communicator whose node-aware state uses `chunk`-byte slots and a `small`
// one-round limit: its first node-aware call sets them, later calls keep them.
Communicator with_slots(std::size_t chunk, std::size_t small) {
  auto c = Communicator::world().dup("slots");
  CollectiveOptions o{Algorithm::shm};
  o.shm_chunk_bytes = chunk;
  o.shm_small_bytes = small;
  std::int32_t x = 1, y = 0;
  allreduce(&x, &y, 1, DType::i32, ReduceOp::sum, c, o);
  EXPECT_EQ(y, c.size());
  return c;
}

class NodeAware : public testing::TestWithParam<Algorithm> {};

TEST_P(NodeAware, EveryDtypeOpCountWithSmallSlots) {
  auto comm = with_slots(4096, 256);
  int p = comm.size();
  std::vector<std::size_t> counts{0, 1, static_cast<std::size_t>(p + 1), 37, 1024 + 7, 3 * 4096 + 5};
  for (DType dt : kDtypes)
    for (ReduceOp op : kOps)
      for (std::size_t n : counts)
        for (bool ip : {false, true}) check(comm, GetParam(), dt, op, n, ip);
}

TEST_P(NodeAware, DefaultSlotsLargeMessages) {
  auto comm = Communicator::world();
  std::size_t n = (1u << 20) + 3;  // 4 MiB of f32: several 1 MiB chunks and a tail
  check(comm, GetParam(), DType::f32, ReduceOp::sum, n, false);
  check(comm, GetParam(), DType::bf16, ReduceOp::avg, n, true);
  check(comm, GetParam(), DType::f64, ReduceOp::max, 5000, false);  // one-round path
}

// Alternating sizes and paths many times: a slot must never be overwritten while
// a peer still reads it (the parity protocol), whatever the sequence.
TEST_P(NodeAware, ManyCallsAlternatingPaths) {
  auto comm = with_slots(8192, 1024);
  for (unsigned i = 0; i < 60; ++i) {
    std::size_t n = i % 3 == 0 ? 7 : i % 3 == 1 ? 5000 : 200;
    check(comm, GetParam(), DType::f32, ReduceOp::sum, n, i % 2 == 0, i);
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, NodeAware, testing::Values(Algorithm::shm, Algorithm::hierarchical),
                         [](const auto& info) { return std::string(algorithm_name(info.param)); });

// The sizes are fixed at the first call: asking for others later is an Error
// on every rank (the options agree), not a silent fallback.
TEST(NodeAware, OtherSlotSizesLaterAreAnError) {
  if (Communicator::world().size() == 1) GTEST_SKIP() << "one rank copies locally: no shared memory is set up";
  auto comm = with_slots(8192, 1024);
  CollectiveOptions same{Algorithm::shm};
  same.shm_chunk_bytes = 8000;  // rounds up to the same 8 KiB slot
  float x = 1, y = 0;
  allreduce(&x, &y, 1, DType::f32, ReduceOp::sum, comm, same);
  EXPECT_EQ(y, static_cast<float>(comm.size()));
  CollectiveOptions other{Algorithm::shm};
  other.shm_chunk_bytes = 1 << 16;
  try {
    allreduce(&x, &y, 1, DType::f32, ReduceOp::sum, comm, other);
    ADD_FAILURE() << "other slot sizes must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("8192-byte slots"), std::string::npos) << e.what();
  }
}

TEST(NodeAware, SplitCommunicatorsHaveTheirOwnSegments) {
  auto world = Communicator::world();
  auto half = world.split(world.rank() % 2, world.rank(), "parity");
  for (int i = 0; i < 3; ++i) {
    check(half, Algorithm::shm, DType::f32, ReduceOp::sum, 70000, i % 2);
    check(world, Algorithm::shm, DType::f32, ReduceOp::sum, 70000, i % 2);
  }
}

TEST(NodeAware, NodeFactsAndAutomaticChoice) {
  auto comm = Communicator::world();
  // mpirun tells each rank its node-local rank and size; ours must agree.
  if (const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    EXPECT_EQ(comm.local_rank(), std::atoi(lr));
  }
  if (const char* ls = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    EXPECT_EQ(comm.local_size(), std::atoi(ls));
  }
  EXPECT_EQ(comm.node_count(), 1);
  EXPECT_EQ(comm.max_local_size(), comm.size());
  CollectiveOptions opt;
  EXPECT_EQ(choose_algorithm(100, 4, opt, 1, 4), Algorithm::shm);
  EXPECT_EQ(choose_algorithm(1 << 24, 4, opt, 2, 2), Algorithm::hierarchical);
  EXPECT_EQ(choose_algorithm(100, 2, opt, 2, 1), Algorithm::tree);  // one rank per node: nothing to share
  EXPECT_EQ(choose_algorithm(1 << 24, 2, opt, 2, 1), Algorithm::ring);
  EXPECT_EQ(parse_algorithm("shm"), Algorithm::shm);
  EXPECT_EQ(parse_algorithm("hierarchical"), Algorithm::hierarchical);
  EXPECT_THROW(parse_algorithm("shared"), Error);
  // Single node: no byte crosses a node boundary.
  std::vector<float> x(100000, 1.0f);
  allreduce(x.data(), x.data(), x.size(), DType::f32, ReduceOp::sum, comm, {Algorithm::hierarchical});
  EXPECT_EQ(x[12345], static_cast<float>(comm.size()));
  EXPECT_EQ(cross_node_bytes_sent(comm), 0u);
}

}  // namespace
