// A stalled collective ends the job with a message: this test launches a
// 2-rank job of this very binary in which rank 1 never joins an all-reduce, with
// a 2 s timeout on its communicator, and checks that the job is aborted quickly
// with a message naming the operation, the missing peer and the communicator.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <string>
#include <vector>

#include "ringtrain/comm/collectives.hpp"

using namespace ringtrain;

namespace {

// Run only inside the child job (disabled in the normal run).
TEST(Stall, DISABLED_RankOneNeverJoins) {
  auto comm = Communicator::world(2.0);
  std::vector<float> x(1000, 1.0f);
  if (comm.rank() == 0) allreduce(x.data(), x.data(), x.size(), DType::f32, ReduceOp::sum, comm, {Algorithm::ring});
  // Rank 1 goes on to the harness's end-of-test MPI_Allreduce and waits there.
}

// Rank 0 alone in an all-reduce of `algo` on a 2-rank world with a 2 s timeout.
void rank_one_never_joins(Algorithm algo) {
  auto comm = Communicator::world(2.0);
  std::vector<float> x(1000, 1.0f);
  if (comm.rank() == 0) allreduce(x.data(), x.data(), x.size(), DType::f32, ReduceOp::sum, comm, {algo});
  // Rank 1 goes on to the harness's end-of-test MPI_Allreduce and waits there.
}

TEST(Stall, DISABLED_RankOneNeverJoinsMpi) { rank_one_never_joins(Algorithm::mpi); }

struct Child {
  std::string out;
  int status = 0;
  double seconds = 0;
};

Child run_child(const std::string& filter) {
  // A clean environment: this process is itself an MPI singleton, whose
  // variables must not leak into the child mpirun.
  std::string cmd =
      "env -i PATH=\"$PATH\" HOME=\"$HOME\" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_btl_vader_single_copy_mechanism=none RINGTRAIN_TEST_WATCHDOG=60 "
      "mpirun -np 2 --oversubscribe /proc/" + std::to_string(getpid()) + "/exe "
      "--gtest_also_run_disabled_tests --gtest_filter=" + filter + " 2>&1";
  Child c;
  auto t0 = std::chrono::steady_clock::now();
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return c;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), f)) c.out += buf.data();
  c.status = pclose(f);
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

TEST(Stall, TimeoutAbortsTheJobWithAMessage) {
  const Child c = run_child("Stall.DISABLED_RankOneNeverJoins");
  const std::string& out = c.out;
  EXPECT_NE(c.status, 0) << out;
  EXPECT_LT(c.seconds, 50.0) << "the stall was not cut short by the 2 s timeout (the 60 s watchdog did it?)\n" << out;
  EXPECT_NE(out.find("allreduce: stalled"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 (world rank 1) of communicator 'world'"), std::string::npos) << out;
  EXPECT_NE(out.find("comm.collective_timeout_s = 2 s"), std::string::npos) << out;
}

// comm.algorithm = mpi: MPI's own all-reduce, completed by wait_bounded
// (comm/bounded_wait.hpp). Before, a blocking MPI_Allreduce: rank 0 waited
// until the 60 s watchdog. Now 2 s, then the liveness grace (5 s): rank 1,
// blocked in the harness's own MPI_Allreduce, answers no ping and is named.
TEST(Stall, MpiAlgorithmTimeoutAbortsTheJobNamingTheRank) {
  const Child c = run_child("Stall.DISABLED_RankOneNeverJoinsMpi");
  const std::string& out = c.out;
  EXPECT_NE(c.status, 0) << out;
  EXPECT_LT(c.seconds, 2.0 + 5.0 + 10.0) << "not ended by the 2 s timeout (the 60 s watchdog did it?)\n" << out;
  EXPECT_NE(out.find("allreduce: stalled for 2 s on communicator 'world': world rank 1 does not respond"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("world rank 0 does not respond"), std::string::npos) << out;
  EXPECT_NE(out.find("Aborting the job (comm.collective_timeout_s = 2 s)"), std::string::npos) << out;
}

}  // namespace
