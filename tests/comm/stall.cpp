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

TEST(Stall, TimeoutAbortsTheJobWithAMessage) {
  // A clean environment: this process is itself an MPI singleton, whose
  // variables must not leak into the child mpirun.
  std::string cmd =
      "env -i PATH=\"$PATH\" HOME=\"$HOME\" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_btl_vader_single_copy_mechanism=none RINGTRAIN_TEST_WATCHDOG=60 "
      "mpirun -np 2 --oversubscribe /proc/" + std::to_string(getpid()) + "/exe "
      "--gtest_also_run_disabled_tests --gtest_filter=Stall.DISABLED_RankOneNeverJoins 2>&1";
  auto t0 = std::chrono::steady_clock::now();
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), f)) out += buf.data();
  int status = pclose(f);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(status, 0) << out;
  EXPECT_LT(s, 50.0) << "the stall was not cut short by the 2 s timeout (the 60 s watchdog did it?)\n" << out;
  EXPECT_NE(out.find("allreduce: stalled"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 (world rank 1) of communicator 'world'"), std::string::npos) << out;
  EXPECT_NE(out.find("comm.collective_timeout_s = 2 s"), std::string::npos) << out;
}

}  // namespace
