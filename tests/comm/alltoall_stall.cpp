// A stalled all-to-all ends the job with a message: a 3-rank job of this very
// binary in which rank 2 never enters the exchange, with a 2 s timeout on its
// communicator. Ranks 0 and 1 finish their step with each other and then wait
// for rank 2; the job must be aborted within the timeout plus the liveness
// grace, naming the operation, rank 2 and the communicator. The same for the
// started form (alltoallv_start, then wait).
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "ringtrain/comm/alltoall.hpp"

using namespace ringtrain;

namespace {

TEST(AlltoallStall, DISABLED_RankTwoNeverEnters) {
  auto comm = Communicator::world(2.0);
  std::vector<float> send(3 * 1000, 1.0f), recv(send.size());
  if (comm.rank() != 2) alltoall(send.data(), recv.data(), 1000, DType::f32, comm);
  // Rank 2 goes on to the harness's end-of-test MPI_Allreduce and waits there.
}

// The started form: ranks 0 and 1 post, compute, then wait for rank 2.
TEST(AlltoallStall, DISABLED_RankTwoNeverStarts) {
  auto comm = Communicator::world(2.0);
  std::vector<float> send(3 * 1000, 1.0f), recv(send.size());
  std::vector<std::size_t> counts(3, 1000), displs{0, 1000, 2000};
  if (comm.rank() != 2) {
    AlltoallvRequest req = alltoallv_start(send.data(), counts, displs, recv.data(), counts, displs, DType::f32, comm);
    req.progress();
    req.wait();
  }
}

struct Child {
  std::string out;
  int status = 0;
  double seconds = 0;
};

Child run_child(const std::string& filter, int np) {
  // A clean environment: this process is itself an MPI singleton, whose
  // variables must not leak into the child mpirun.
  std::string cmd =
      "env -i PATH=\"$PATH\" HOME=\"$HOME\" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_btl_vader_single_copy_mechanism=none RINGTRAIN_TEST_WATCHDOG=60 "
      "mpirun -np " +
      std::to_string(np) + " --oversubscribe /proc/" + std::to_string(getpid()) +
      "/exe "
      "--gtest_also_run_disabled_tests --gtest_filter=" +
      filter + " 2>&1";
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

TEST(AlltoallStall, TimeoutAbortsTheJobNamingTheRankThatNeverEntered) {
  const Child c = run_child("AlltoallStall.DISABLED_RankTwoNeverEnters", 3);
  const std::string& out = c.out;
  EXPECT_NE(c.status, 0) << out;
  // 2 s timeout + 5 s liveness grace + start-up; the watchdog would take 60 s.
  EXPECT_LT(c.seconds, 2.0 + 5.0 + 15.0) << "not ended by the 2 s timeout (the 60 s watchdog did it?)\n" << out;
  EXPECT_NE(out.find("alltoallv: stalled for 2 s on communicator 'world': world rank 2 does not respond"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("was waiting to receive from rank 2 of 'world' (world rank 2)"), std::string::npos) << out;
  EXPECT_EQ(out.find("world rank 1 does not respond"), std::string::npos) << out;
  EXPECT_NE(out.find("Aborting the job (comm.collective_timeout_s = 2 s)"), std::string::npos) << out;
}

TEST(AlltoallStall, StartedFormTimeoutNamesTheRankThatNeverStarted) {
  const Child c = run_child("AlltoallStall.DISABLED_RankTwoNeverStarts", 3);
  const std::string& out = c.out;
  EXPECT_NE(c.status, 0) << out;
  EXPECT_LT(c.seconds, 2.0 + 5.0 + 15.0) << "not ended by the 2 s timeout (the 60 s watchdog did it?)\n" << out;
  EXPECT_NE(out.find("alltoallv_start: stalled for 2 s on communicator 'world': world rank 2 does not respond"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("was waiting to receive from rank 2 of 'world' (world rank 2)"), std::string::npos) << out;
  EXPECT_NE(out.find("Aborting the job (comm.collective_timeout_s = 2 s)"), std::string::npos) << out;
}

}  // namespace
