// All-reduce against MPI_Allreduce on the same data: every algorithm x dtype x op
// x count (0, 1, p-1, p, p+1, odd multi-segment sizes; 1M+3 for a subset) x
// in-place/out-of-place, plus bitwise agreement of the result across ranks.
#include <gtest/gtest.h>

#include <string>

#include "reference.hpp"

using namespace ringtrain;
using namespace rt_test;

namespace {

const DType kDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max};
const Algorithm kAlgos[] = {Algorithm::ring,         Algorithm::tree, Algorithm::automatic,
                            Algorithm::mpi,          Algorithm::shm,  Algorithm::hierarchical};

// shm serves one node only: across emulated hosts (tests/hosts) it must refuse, on every rank.
bool spans_nodes_with_shm(const Communicator& comm, Algorithm algo) {
  if (algo != Algorithm::shm || comm.node_count() == 1) return false;
  float x = 1, y = 0;
  EXPECT_THROW(allreduce(&x, &y, 1, DType::f32, ReduceOp::sum, comm, {algo}), Error);
  return true;
}

void check_allreduce(const Communicator& comm, Algorithm algo, DType dtype, ReduceOp op, std::size_t count,
                     bool in_place, std::size_t segment_bytes = 0) {
  if (spans_nodes_with_shm(comm, algo)) return;
  MPI_Comm h = comm.handle();
  int p = comm.size();
  std::string what = std::string(algorithm_name(algo)) + " " + dtype_name(dtype) + " " + op_name(op) +
                     " count=" + std::to_string(count) + (in_place ? " in-place" : " out-of-place") +
                     (segment_bytes ? " segment=" + std::to_string(segment_bytes) : "") + " p=" + std::to_string(p);
  SCOPED_TRACE(what);
  auto in = make_data(dtype, count, comm.rank(), static_cast<unsigned>(count));
  const auto original = in;
  Expected e = reference_allreduce(in.data(), count, dtype, op, h);
  CollectiveOptions opt;
  opt.algorithm = algo;
  opt.segment_bytes = segment_bytes;
  std::vector<unsigned char> out = in;
  if (!in_place) std::fill(out.begin(), out.end(), 0xAB);
  allreduce(in_place ? out.data() : in.data(), out.data(), count, dtype, op, comm, opt);
  expect_matches(out.data(), e, count, dtype, op, p, what.c_str());
  expect_bitwise_equal_across(out.data(), count * dtype_size(dtype), h, what.c_str());
  if (!in_place) {
    EXPECT_TRUE(in == original) << "out-of-place all-reduce modified its input";
  }
}

class AllreduceAlgo : public testing::TestWithParam<Algorithm> {};

TEST_P(AllreduceAlgo, EveryDtypeOpAndSmallCount) {
  auto comm = Communicator::world();
  int p = comm.size();
  std::vector<std::size_t> counts{0, 1, static_cast<std::size_t>(p - 1), static_cast<std::size_t>(p),
                                  static_cast<std::size_t>(p + 1), 37};
  for (DType dt : kDtypes)
    for (ReduceOp op : kOps)
      for (std::size_t n : counts)
        for (bool ip : {false, true}) check_allreduce(comm, GetParam(), dt, op, n, ip);
}

// Tiny segments: many segments per chunk, so the receive window, the pipelining
// and the in-place guards are all exercised.
TEST_P(AllreduceAlgo, ManySegments) {
  auto comm = Communicator::world();
  for (DType dt : kDtypes)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
      for (bool ip : {false, true}) check_allreduce(comm, GetParam(), dt, op, 1000 + 7, ip, 64);
  check_allreduce(comm, GetParam(), DType::f32, ReduceOp::max, 4099, true, 256);
}

TEST_P(AllreduceAlgo, LargeMessage) {
  auto comm = Communicator::world();
  std::size_t n = (1u << 20) + 3;
  check_allreduce(comm, GetParam(), DType::f32, ReduceOp::sum, n, false);
  check_allreduce(comm, GetParam(), DType::bf16, ReduceOp::sum, n, true);
  if (GetParam() == Algorithm::ring) {  // the bandwidth path: a few more kinds
    check_allreduce(comm, GetParam(), DType::f16, ReduceOp::avg, n, false);
    check_allreduce(comm, GetParam(), DType::i32, ReduceOp::max, n, true);
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AllreduceAlgo, testing::ValuesIn(kAlgos),
                         [](const auto& info) { return std::string(algorithm_name(info.param)); });

TEST(Allreduce, SplitCommunicatorsEvenOdd) {
  auto world = Communicator::world();
  auto half = world.split(world.rank() % 2, world.rank(), "parity");
  EXPECT_EQ(half.size(), (world.size() + 1 - world.rank() % 2) / 2);
  for (Algorithm a : kAlgos)
    for (bool ip : {false, true}) {
      check_allreduce(half, a, DType::f32, ReduceOp::sum, 1003, ip);
      check_allreduce(half, a, DType::i64, ReduceOp::avg, 17, ip);
    }
}

TEST(Allreduce, AvgIsSumThenOneDivision) {
  // Integers: truncating division of the exact sum, e.g. (1 + 2 + ...) / p.
  auto comm = Communicator::world();
  int p = comm.size();
  std::int32_t x = comm.rank() + 1, y = 0;
  for (Algorithm a : kAlgos) {
    if (spans_nodes_with_shm(comm, a)) continue;
    allreduce(&x, &y, 1, DType::i32, ReduceOp::avg, comm, {a});
    EXPECT_EQ(y, (p * (p + 1) / 2) / p) << algorithm_name(a);
  }
  // -1 on every rank but the last, p - 1 there: the sum is 0 whatever p.
  std::int64_t z = comm.rank() == p - 1 ? p - 1 : -1, w = 7;
  allreduce(&z, &w, 1, DType::i64, ReduceOp::avg, comm, {Algorithm::ring});
  EXPECT_EQ(w, 0);
}

TEST(Allreduce, AutomaticFollowsTheThreshold) {
  CollectiveOptions opt;
  opt.tree_threshold = 1000;
  EXPECT_EQ(choose_algorithm(1000, 4, opt), Algorithm::tree);
  EXPECT_EQ(choose_algorithm(1001, 4, opt), Algorithm::ring);
  opt.algorithm = Algorithm::mpi;
  EXPECT_EQ(choose_algorithm(10, 4, opt), Algorithm::mpi);
  CollectiveOptions def;  // < 0: the built-in default
  EXPECT_EQ(effective_tree_threshold(def), kDefaultTreeThreshold);
  EXPECT_EQ(choose_algorithm(kDefaultTreeThreshold, 3, def), Algorithm::tree);
  EXPECT_EQ(choose_algorithm(kDefaultTreeThreshold + 1, 3, def), Algorithm::ring);
  EXPECT_EQ(effective_segment_bytes(def), kDefaultSegmentBytes);
  def.segment_bytes = 32;
  EXPECT_THROW(effective_segment_bytes(def), Error);
}

}  // namespace
