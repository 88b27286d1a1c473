// The flight recorder and `diagnose` on real failures: 3-rank jobs of this very
// binary (2 s collective timeout) in which
//  - rank 2 stops taking part (it goes on to the harness's blocking
//    MPI_Allreduce, where it answers no liveness ping and writes no record);
//  - rank 2 enters a broadcast where ranks 0 and 1 enter an all-reduce;
//  - rank 1 dies of SIGSEGV;
// then diagnose() on the records must name the rank and the collective.
#include "ringtrain/comm/flight_recorder.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/error.hpp"

using namespace ringtrain;

namespace {

// The ring algorithm: shm's set-up would add collectives of its own to the count.
const CollectiveOptions kRing{Algorithm::ring};

// The child's setup: records into $RT_FLIGHT_DIR, 5 all-reduces all ranks finish.
Communicator start_child() {
  const char* dir = std::getenv("RT_FLIGHT_DIR");
  flight_recorder::configure(dir ? dir : "", 64);
  auto comm = Communicator::world(2.0);  // collectives #1, #2: the dup's layout all-reduces
  std::vector<float> x(1000, 1.0f);
  for (int i = 0; i < 5; ++i) allreduce(x.data(), x.data(), x.size(), DType::f32, ReduceOp::sum, comm, kRing);  // #3-#7
  return comm;
}

TEST(FlightChild, DISABLED_RankTwoStops) {
  auto comm = start_child();
  std::vector<float> x(1000, 1.0f);
  if (comm.rank() != 2) allreduce(x.data(), x.data(), x.size(), DType::f32, ReduceOp::sum, comm, kRing);  // #8
}

TEST(FlightChild, DISABLED_RankTwoBroadcasts) {
  auto comm = start_child();
  std::vector<float> x(1000, 1.0f);
  if (comm.rank() != 2)
    allreduce(x.data(), x.data(), x.size(), DType::f32, ReduceOp::sum, comm, kRing);
  else
    broadcast(x.data(), x.size(), DType::f32, 0, comm, kRing);
}

TEST(FlightChild, DISABLED_RankOneCrashes) {
  auto comm = start_child();
  if (comm.rank() == 1) std::raise(SIGSEGV);
  std::vector<float> x(1000, 1.0f);
  allreduce(x.data(), x.data(), x.size(), DType::f32, ReduceOp::sum, comm, kRing);
}

// A stall's diagnosis, then another thread's record, then a fatal signal (what MPI_Abort from one thread did to
// another thread still in MPI: stall_trials' verify_every once): the records keep the diagnosis.
TEST(FlightChild, DISABLED_RankOneCrashesAfterADiagnosis) {
  auto comm = start_child();
  if (comm.rank() == 1) {
    flight_recorder::dump("allreduce: stalled for 3 s on communicator 'world': world rank 2 does not respond", true);
    flight_recorder::dump("liveness ping from world rank 0 (its wait timed out)");
    std::raise(SIGSEGV);
  }
  std::vector<float> x(1000, 1.0f);
  allreduce(x.data(), x.data(), x.size(), DType::f32, ReduceOp::sum, comm, kRing);
}

// Runs the child test `name` at 3 ranks with records into a fresh directory; returns the directory.
std::string run_child(const std::string& name, std::string* out) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("rt-flight-" + std::to_string(getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  const std::string cmd =
      "env -i PATH=\"$PATH\" HOME=\"$HOME\" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_btl_vader_single_copy_mechanism=none RINGTRAIN_TEST_WATCHDOG=60 RT_FLIGHT_DIR=" +
      dir + " mpirun -np 3 --oversubscribe /proc/" + std::to_string(getpid()) +
      "/exe "
      "--gtest_also_run_disabled_tests --gtest_filter=FlightChild.DISABLED_" +
      name + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return dir;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), f)) *out += buf.data();
  pclose(f);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 50.0) << "not ended by the 2 s timeout (the 60 s watchdog did it?)\n" << *out;
  return dir;
}

std::string diagnosis(const std::string& dir) {
  try {
    return flight_recorder::diagnose(dir);
  } catch (const Error& e) {
    return std::string("Error: ") + e.what();
  }
}

TEST(FlightRecorder, NamesTheRankThatStoppedAndTheCollective) {
  std::string out;
  const std::string dir = run_child("RankTwoStops", &out);
  const std::string d = diagnosis(dir);
  EXPECT_TRUE(std::filesystem::exists(dir + "/rank0.jsonl")) << out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/rank1.jsonl")) << out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/rank2.jsonl")) << "rank 2 was blocked in MPI, outside our waits";
  EXPECT_NE(d.find("world ranks 0, 1 of 3"), std::string::npos) << d << out;
  EXPECT_NE(d.find("world rank 2 wrote none"), std::string::npos) << d;
  EXPECT_NE(d.find("First disagreement: communicator 'world' (world ranks 0-2), collective #8:"), std::string::npos)
      << d;
  EXPECT_NE(d.find("world rank 2 wrote no record (stopped, hung, dead, or blocked outside ringtrain's waits): it "
                   "never finished this collective"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("world rank 0: #8 allreduce (4000 bytes), not finished"), std::string::npos) << d;
  EXPECT_NE(d.find("world rank 1: #8 allreduce (4000 bytes), not finished"), std::string::npos) << d;
  std::filesystem::remove_all(dir);
}

TEST(FlightRecorder, NamesTheRankThatEnteredAnotherCollective) {
  std::string out;
  const std::string dir = run_child("RankTwoBroadcasts", &out);
  const std::string d = diagnosis(dir);
  EXPECT_NE(d.find("world ranks 0-2 of 3"), std::string::npos) << d << out;
  EXPECT_NE(d.find("First disagreement: communicator 'world' (world ranks 0-2), collective #8:"), std::string::npos)
      << d;
  EXPECT_NE(d.find("world rank 2 entered broadcast (4000 bytes) instead of allreduce (4000 bytes)"), std::string::npos)
      << d;
  std::filesystem::remove_all(dir);
}

TEST(FlightRecorder, AFatalSignalWritesTheRecord) {
  std::string out;
  const std::string dir = run_child("RankOneCrashes", &out);
  const std::string d = diagnosis(dir);
  const std::size_t at = d.find("world rank 1 wrote it");
  ASSERT_NE(at, std::string::npos) << d << out;
  const std::string line = d.substr(at, d.find('\n', at) - at);
  EXPECT_NE(line.find(" s after the first, on: fatal signal 11"), std::string::npos) << line;
  std::filesystem::remove_all(dir);
}

TEST(FlightRecorder, ALaterRecordKeepsTheStallsDiagnosis) {
  std::string out;
  const std::string dir = run_child("RankOneCrashesAfterADiagnosis", &out);
  const std::string d = diagnosis(dir);
  const std::size_t at = d.find("world rank 1 wrote it");
  ASSERT_NE(at, std::string::npos) << d << out;
  const std::string line = d.substr(at, d.find('\n', at) - at);
  EXPECT_NE(line.find("on: allreduce: stalled for 3 s on communicator 'world': world rank 2 does not respond; "
                      "later: fatal signal 11"),
            std::string::npos)
      << line;
  std::filesystem::remove_all(dir);
}

TEST(FlightRecorder, DiagnoseOfADirectoryWithoutRecordsSaysSo) {
  const auto dir = std::filesystem::temp_directory_path() / ("rt-flight-empty-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  EXPECT_NE(diagnosis(dir).find("no flight record (rank<N>.jsonl)"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
