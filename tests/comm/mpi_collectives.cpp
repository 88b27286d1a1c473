// Broadcast, all-gather(v) and reduce-scatter against MPI's own collectives on
// the same data, for every algorithm, several dtypes, roots and ragged counts
// (including empty blocks), in place and out of place, with tiny segments too.
#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "reference.hpp"

using namespace ringtrain;
using namespace rt_test;

namespace {

const Algorithm kAlgos[] = {Algorithm::automatic, Algorithm::ring, Algorithm::tree, Algorithm::mpi};
const DType kDtypes[] = {DType::f32, DType::f64, DType::bf16, DType::i64, DType::u8};

std::string label(const char* what, Algorithm a, DType t, std::size_t n, std::size_t seg) {
  return std::string(what) + " " + algorithm_name(a) + " " + dtype_name(t) + " n=" + std::to_string(n) +
         (seg ? " segment=" + std::to_string(seg) : "");
}

TEST(Broadcast, MatchesMpiBcastFromEveryRoot) {
  auto comm = Communicator::world();
  int p = comm.size();
  for (Algorithm a : kAlgos)
    for (DType t : kDtypes)
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(p + 1), std::size_t{5003}})
        for (std::size_t seg : {std::size_t{0}, std::size_t{64}})
          for (int root = 0; root < p; ++root) {
            auto what = label("broadcast", a, t, n, seg) + " root=" + std::to_string(root);
            SCOPED_TRACE(what);
            auto mine = make_data(t, n, comm.rank(), 7);
            auto want = mine;
            MPI_Bcast(want.data(), static_cast<int>(n * dtype_size(t)), MPI_BYTE, root, MPI_COMM_WORLD);
            CollectiveOptions opt{a};
            opt.segment_bytes = seg;
            broadcast(mine.data(), n, t, root, comm, opt);
            EXPECT_TRUE(mine == want) << what;
          }
}

// Ragged blocks: rank r contributes (r * 37 + base) % 11 elements (some zero).
std::vector<std::size_t> ragged(int p, std::size_t base) {
  std::vector<std::size_t> c(p);
  for (int r = 0; r < p; ++r) c[r] = (static_cast<std::size_t>(r) * 37 + base) % 11 * (base > 5 ? 300 : 1);
  return c;
}

TEST(Allgather, AllgathervMatchesMpiAllgatherv) {
  auto comm = Communicator::world();
  int p = comm.size(), r = comm.rank();
  for (Algorithm a : kAlgos)
    for (DType t : kDtypes)
      for (std::size_t base : {0, 3, 7})
        for (std::size_t seg : {std::size_t{0}, std::size_t{64}})
          for (bool in_place : {false, true}) {
            auto counts = ragged(p, base);
            std::vector<int> ic(p), displ(p);
            std::size_t total = 0, es = dtype_size(t);
            for (int i = 0; i < p; ++i) {
              ic[i] = static_cast<int>(counts[i] * es);
              displ[i] = static_cast<int>(total * es);
              total += counts[i];
            }
            auto what = label("allgatherv", a, t, total, seg) + (in_place ? " in-place" : "");
            SCOPED_TRACE(what);
            auto mine = make_data(t, counts[r], r, 11);
            std::vector<unsigned char> want(total * es + 1), got(total * es + 1, 0xCD);
            MPI_Allgatherv(mine.data(), ic[r], MPI_BYTE, want.data(), ic.data(), displ.data(), MPI_BYTE,
                           MPI_COMM_WORLD);
            const void* send = mine.data();
            if (in_place) {
              std::copy(mine.begin(), mine.end() - 1, got.begin() + displ[r]);
              send = got.data() + displ[r];
            }
            CollectiveOptions opt{a};
            opt.segment_bytes = seg;
            allgatherv(send, got.data(), counts, t, comm, opt);
            EXPECT_EQ(0, std::memcmp(got.data(), want.data(), total * es)) << what;
          }
}

TEST(Allgather, EqualBlocks) {
  auto comm = Communicator::world();
  int p = comm.size();
  for (Algorithm a : kAlgos)
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}}) {
      auto mine = make_data(DType::i32, n, comm.rank(), 3);
      std::vector<unsigned char> want(p * n * 4 + 1), got(p * n * 4 + 1);
      MPI_Allgather(mine.data(), static_cast<int>(n * 4), MPI_BYTE, want.data(), static_cast<int>(n * 4), MPI_BYTE,
                    MPI_COMM_WORLD);
      allgather(mine.data(), n, got.data(), DType::i32, comm, {a});
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), p * n * 4)) << algorithm_name(a) << " n=" << n;
    }
}

TEST(ReduceScatter, MatchesTheReductionOfEachBlock) {
  auto comm = Communicator::world();
  int p = comm.size(), r = comm.rank();
  for (Algorithm a : kAlgos)
    for (DType t : {DType::f32, DType::bf16, DType::i32, DType::i64})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
        for (std::size_t base : {0, 4, 9})
          for (std::size_t seg : {std::size_t{0}, std::size_t{64}})
            for (bool in_place : {false, true}) {
              auto counts = ragged(p, base);
              std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
              std::size_t es = dtype_size(t), before = 0;
              for (int i = 0; i < r; ++i) before += counts[i];
              auto what = label("reduce_scatter", a, t, total, seg) + " " + op_name(op) + (in_place ? " in-place" : "");
              SCOPED_TRACE(what);
              auto in = make_data(t, total, r, 5);
              Expected e = reference_allreduce(in.data(), total, t, op, MPI_COMM_WORLD);
              // My block of the full all-reduce is what reduce_scatter must give me.
              if (!e.exact.empty()) e.exact.erase(e.exact.begin(), e.exact.begin() + before * es);
              if (!e.value.empty()) {
                e.value.erase(e.value.begin(), e.value.begin() + before);
                e.abs_sum.erase(e.abs_sum.begin(), e.abs_sum.begin() + before);
              }
              std::vector<unsigned char> out(counts[r] * es + 1, 0xEE);
              void* recv = in_place ? in.data() + before * es : out.data();
              CollectiveOptions opt{a};
              opt.segment_bytes = seg;
              reduce_scatter(in.data(), recv, counts, t, op, comm, opt);
              expect_matches(static_cast<unsigned char*>(recv), e, counts[r], t, op, p, what.c_str());
            }
}

// Blocks of megabytes: many segments per block, beyond the transport's eager
// limit (every send waits for its receive), as ZeRO's and sequence
// parallelism's reduce-scatters are.
TEST(ReduceScatter, LargeBlocksOfManySegments) {
  auto comm = Communicator::world();
  int p = comm.size(), r = comm.rank();
  for (Algorithm a : kAlgos)
    for (std::size_t per : {std::size_t{200000}, std::size_t{802816}}) {
      std::vector<std::size_t> counts(p, per);
      const std::size_t total = per * p;
      auto in = make_data(DType::f32, total, r, 7);
      Expected e = reference_allreduce(in.data(), total, DType::f32, ReduceOp::sum, MPI_COMM_WORLD);
      if (!e.value.empty()) {
        e.value.erase(e.value.begin(), e.value.begin() + per * r);
        e.abs_sum.erase(e.abs_sum.begin(), e.abs_sum.begin() + per * r);
      }
      std::vector<unsigned char> out(per * 4 + 1, 0xEE);
      const auto what = label("reduce_scatter", a, DType::f32, total, 0);
      reduce_scatter(in.data(), out.data(), counts, DType::f32, ReduceOp::sum, comm, {a});
      expect_matches(out.data(), e, per, DType::f32, ReduceOp::sum, p, what.c_str());
    }
}

TEST(Broadcast, ThenAllreduceLeavesEveryRankIdentical) {
  // Parameters broadcast from rank 0, then averaged gradients: the usual start-up.
  auto comm = Communicator::world();
  auto w = make_data(DType::f32, 3001, comm.rank(), 1);
  broadcast(w.data(), 3001, DType::f32, 0, comm);
  expect_bitwise_equal_across(w.data(), 3001 * 4, MPI_COMM_WORLD, "broadcast");
  allreduce(w.data(), w.data(), 3001, DType::f32, ReduceOp::avg, comm);
  expect_bitwise_equal_across(w.data(), 3001 * 4, MPI_COMM_WORLD, "allreduce after broadcast");
}

}  // namespace
