#pragma once
// One persistent helper thread that runs tasks in submission order: the
// tensor-parallel layers hand it a collective (ColumnParallel's dgrad
// all-reduce) to overlap with their own compute, instead of starting a thread
// per backward (std::async did: one thread creation, ~20-50 us, per layer and
// step, and an unbounded number of threads calling MPI over a run).
// The thread starts at the first submit() and is joined by the destructor,
// after the tasks already queued have run. submit() is thread-safe.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace ringtrain {

class TaskThread {
 public:
  TaskThread() = default;
  ~TaskThread();
  TaskThread(const TaskThread&) = delete;
  TaskThread& operator=(const TaskThread&) = delete;

  // Runs `task` on the helper thread; the future's get() waits for it and rethrows what it threw.
  std::future<void> submit(std::function<void()> task);

  // Helper threads every TaskThread of this process has started (for tests and diagnostics).
  static std::uint64_t threads_started();

 private:
  void loop();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ringtrain
