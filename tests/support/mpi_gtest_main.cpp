// GoogleTest main for every ringtrain test binary, single- or multi-rank.
//  - Starts MPI; rank 0 prints the usual gtest output, other ranks print only
//    their failures, prefixed with the rank.
//  - After each test the ranks OR their failure bits: a test that failed on any
//    rank is reported on every rank and the binary fails on every rank.
//  - A watchdog aborts the whole job (MPI_Abort, with a message naming the test
//    and the rank) when a test runs longer than RINGTRAIN_TEST_WATCHDOG seconds
//    (default 240), so a stalled collective never hangs CI.
//  - With --rt-gpu the binary exits 77 (CTest's "skipped") when no CUDA device
//    is registered, saying so.
//  - A binary whose every test skipped (GTEST_SKIP, e.g. a layout that this
//    rank count cannot form) also exits 77: CTest shows it as skipped, not passed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/allocator.hpp"
#include "ringtrain/core/device_module.hpp"

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

class Watchdog {
 public:
  explicit Watchdog(double limit_s) : limit_s_(limit_s), thread_([this] { run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void start(const std::string& name) {
    std::lock_guard lk(mu_);
    name_ = name;
    started_ = std::chrono::steady_clock::now();
    active_ = true;
  }
  void end() {
    std::lock_guard lk(mu_);
    active_ = false;
  }

 private:
  void run() {
    std::unique_lock lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(200));
      if (!active_) continue;
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      if (s > limit_s_) {
        std::fprintf(stderr,
                     "[rank %d] watchdog: test %s has run for %.0f s (limit %.0f s, "
                     "RINGTRAIN_TEST_WATCHDOG); aborting the job\n",
                     world_rank(), name_.c_str(), s, limit_s_);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 3);
      }
    }
  }
  double limit_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string name_;
  std::chrono::steady_clock::time_point started_;
  bool active_ = false, stop_ = false;
  std::thread thread_;
};

class RankListener : public testing::EmptyTestEventListener {
 public:
  RankListener(Watchdog& wd, int rank, bool print_failures) : wd_(wd), rank_(rank), print_(print_failures) {}
  void OnTestStart(const testing::TestInfo& t) override {
    wd_.start(std::string(t.test_suite_name()) + "." + t.name());
  }
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (print_ && r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.message());
  }
  void OnTestEnd(const testing::TestInfo& t) override {
    wd_.end();
    int mine = t.result()->Failed() ? 1 : 0;
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    // Which ranks failed, as a count and the lowest failing rank.
    int any = 0, first = mine ? rank_ : size;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (any) {
      failed_any_ = true;
      if (rank_ == 0)
        std::fprintf(stderr, "[ringtrain] %s.%s failed on %d of %d ranks (first: rank %d)\n",
                     t.test_suite_name(), t.name(), any, size, first);
    }
  }
  bool failed_any() const { return failed_any_; }

 private:
  Watchdog& wd_;
  int rank_;
  bool print_;
  bool failed_any_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  bool gpu = false;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--rt-gpu")) gpu = true;
  ringtrain::MpiRuntime mpi(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  int rank = world_rank();

  if (gpu) {  // the CUDA module, unless the test links it: a GPU host that cannot load it fails
    try {
      ringtrain::load_device_module(ringtrain::DeviceKind::cuda);
    } catch (const std::exception& e) {
      if (rank == 0) std::printf("%s\n", e.what());
      if (ringtrain::device_driver_present(ringtrain::DeviceKind::cuda)) return 1;
    }
  }
  if (gpu && !ringtrain::has_allocator(ringtrain::DeviceKind::cuda)) {
    if (rank == 0)
      std::printf("SKIPPED: no CUDA device is present (or ringtrain was built without CUDA); "
                  "run tests/gpu/run_on_gpu_host.sh on a GPU machine\n");
    return 77;
  }

  double limit = 240;
  if (const char* v = std::getenv("RINGTRAIN_TEST_WATCHDOG")) limit = std::atof(v);
  Watchdog wd(limit);
  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) delete listeners.Release(listeners.default_result_printer());
  auto* rl = new RankListener(wd, rank, rank != 0);
  listeners.Append(rl);

  int rc = RUN_ALL_TESTS();
  int local = (rc != 0 || rl->failed_any()) ? 1 : 0, global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const testing::UnitTest& u = *testing::UnitTest::GetInstance();
  if (global == 0 && u.test_to_run_count() > 0 && u.skipped_test_count() == u.test_to_run_count()) return 77;
  return global;
}
