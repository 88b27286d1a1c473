#include "async_writer.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain {

AsyncWriter::~AsyncWriter() {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !job_ && !running_; });  // the write in flight completes
    quit_ = true;
    // Only reached with an error pending when the run is already ending on another one.
    if (error_) try {
        std::rethrow_exception(error_);
      } catch (const std::exception& e) {
        log::error("background checkpoint write failed: ", e.what());
      }
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void AsyncWriter::submit(std::function<void()> job) {
  wait();
  {
    std::lock_guard lock(mu_);
    job_ = std::move(job);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_all();
}

void AsyncWriter::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !job_ && !running_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

bool AsyncWriter::busy() const {
  std::lock_guard lock(mu_);
  return job_ || running_;
}

bool AsyncWriter::succeeded() const {
  std::lock_guard lock(mu_);
  return !job_ && !running_ && !error_;
}

void AsyncWriter::loop() {
  // Below the training threads: on a busy node the write yields the cores to the steps
  // (Linux: a thread's nice value is its own; failing to lower it changes nothing else).
  const id_t tid = static_cast<id_t>(::gettid());
  errno = 0;
  const int nice = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0 && lower_priority_) ::setpriority(PRIO_PROCESS, tid, std::min(19, nice + 10));
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return quit_ || job_; });
    if (!job_) return;  // quit_ with nothing left to write
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    running_ = true;
    lock.unlock();
    std::exception_ptr err;
    try {
      job();
    } catch (...) {
      err = std::current_exception();
    }
    job = nullptr;  // the snapshot is freed before anyone waiting is told
    lock.lock();
    running_ = false;
    error_ = err;
    cv_.notify_all();
  }
}

}  // namespace ringtrain
