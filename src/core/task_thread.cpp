#include "ringtrain/core/task_thread.hpp"

#include <atomic>

namespace ringtrain {
namespace {
std::atomic<std::uint64_t> g_started{0};
}  // namespace

std::uint64_t TaskThread::threads_started() { return g_started.load(); }

std::future<void> TaskThread::submit(std::function<void()> task) {
  std::packaged_task<void()> p(std::move(task));
  std::future<void> f = p.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(p));
    if (!thread_.joinable()) {
      thread_ = std::thread([this] { loop(); });
      g_started.fetch_add(1);
    }
  }
  cv_.notify_one();
  return f;
}

void TaskThread::loop() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // an exception lands in the task's future
  }
}

TaskThread::~TaskThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

}  // namespace ringtrain
