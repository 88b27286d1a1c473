// The pieces of issue 40's items 6 and 7 that run in one process:
// wait_bounded (comm/bounded_wait.hpp) completes what completes and gives up
// on what never does, naming the operation and the communicator; the thread
// level check refuses anything below MPI_THREAD_MULTIPLE; TaskThread (the
// tensor groups' persistent helper) runs tasks in order on one thread and
// hands their exceptions back. The multi-rank stall paths are in
// tests/comm/stall.cpp and tests/train/stall_trials.cpp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/task_thread.hpp"

using namespace ringtrain;

namespace {

TEST(ThreadLevel, RefusesEveryLevelBelowMultiple) {
  for (int level : {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED}) {
    const std::string e = thread_level_error(level);
    EXPECT_NE(e.find("ringtrain needs MPI_THREAD_MULTIPLE"), std::string::npos) << e;
    EXPECT_NE(e.find("(" + std::to_string(level) + ")"), std::string::npos) << e;
  }
  EXPECT_NE(thread_level_error(MPI_THREAD_SERIALIZED).find("MPI_THREAD_SERIALIZED"), std::string::npos);
  EXPECT_NE(thread_level_error(MPI_THREAD_FUNNELED).find("MPI_THREAD_FUNNELED"), std::string::npos);
  EXPECT_EQ(thread_level_error(MPI_THREAD_MULTIPLE), "");
}

TEST(ThreadLevel, ThisProcessRunsWithMultiple) {
  // MpiRuntime (tests/support/mpi_gtest_main.cpp) would have refused to start otherwise.
  int provided = 0;
  MPI_Query_thread(&provided);
  EXPECT_EQ(provided, MPI_THREAD_MULTIPLE);
}

TEST(BoundedWait, CompletesWhatCompletes) {
  Communicator self = Communicator::dup_of(MPI_COMM_SELF, "self", 5.0);
  const WaitOn on(self, "test");
  int in = 41, out = 0;
  MPI_Request q[2];
  MPI_Irecv(&out, 1, MPI_INT, 0, 9, on.comm, &q[1]);
  MPI_Isend(&in, 1, MPI_INT, 0, 9, on.comm, &q[0]);
  wait_bounded(q, 2, on, "self exchange");
  EXPECT_EQ(out, 41);
  double v[3] = {1.5, -2, 4};
  bounded::allreduce(v, 3, MPI_DOUBLE, MPI_SUM, on, "self all-reduce");  // one rank: the values themselves
  EXPECT_EQ(v[0], 1.5);
  EXPECT_EQ(v[2], 4);
}

TEST(BoundedWait, GivesUpAfterTheTimeoutNamingTheWait) {
  Communicator self = Communicator::dup_of(MPI_COMM_SELF, "lonely", 0.3);
  const WaitOn on(self, "test");
  int never = 0;
  MPI_Request q;
  MPI_Irecv(&never, 1, MPI_INT, 0, 11, on.comm, &q);  // no one sends it
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    wait_bounded(&q, 1, on, "waiting for nobody", OnStall::throw_error);
  } catch (const StallError& e) {
    msg = e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(msg.find("waiting for nobody: stalled for 0 s on communicator 'lonely'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("comm.collective_timeout_s = 0.3 s"), std::string::npos) << msg;
  EXPECT_GE(s, 0.3);
  EXPECT_LT(s, 0.3 + 6.0);  // + the diagnosis' grace period at most (one rank: nobody to ask)
  MPI_Cancel(&q);
  MPI_Request_free(&q);
}

TEST(BoundedWait, MpiErrorsNameTheCall) {
  try {
    check_mpi(MPI_ERR_COUNT, "sending x", "MPI_Isend");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sending x: MPI_Isend failed (MPI error"), std::string::npos) << e.what();
  }
}

TEST(TaskThread, RunsTasksInOrderOnOnePersistentThread) {
  const std::uint64_t before = TaskThread::threads_started();
  std::vector<int> order;
  std::vector<std::thread::id> ids;
  {
    TaskThread t;
    EXPECT_EQ(TaskThread::threads_started(), before) << "started before its first task";
    std::vector<std::future<void>> fs;
    for (int i = 0; i < 100; ++i)
      fs.push_back(t.submit([&, i] {
        order.push_back(i);
        ids.push_back(std::this_thread::get_id());
      }));
    for (auto& f : fs) f.get();
  }  // joined here
  EXPECT_EQ(TaskThread::threads_started(), before + 1);
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
  for (auto id : ids) EXPECT_EQ(id, ids[0]);
  EXPECT_NE(ids[0], std::this_thread::get_id());
}

TEST(TaskThread, HandsBackTheTaskException) {
  TaskThread t;
  auto f = t.submit([] { throw Error("allreduce failed"); });
  EXPECT_THROW(f.get(), Error);
  int after = 0;
  t.submit([&] { after = 7; }).get();  // the thread survives a throwing task
  EXPECT_EQ(after, 7);
}

}  // namespace
