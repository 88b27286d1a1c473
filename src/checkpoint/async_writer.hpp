#pragma once
// One background thread that runs checkpoint writes, one at a time, so the
// training loop only pays for the snapshot (the state copied to host memory)
// and not for building, writing and fsyncing the file.
//
// Rules: submit() first waits for the write in flight (a second save never
// queues behind or races the first: at most one snapshot is held, and lost
// work stays bounded by the checkpoint interval); a write's Error is kept and
// rethrown by the next wait() or submit() on the caller's thread; the
// destructor waits for the write in flight, so a process that ends normally
// or by an exception never abandons a half-written file (a kill leaves only a
// temporary file, which the next run removes).
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace ringtrain {

class AsyncWriter {
 public:
  // `lower_priority`: the thread runs 10 nice levels below training (a disk
  // write has an interval's time); false where the next step may wait for the
  // job (in-memory snapshots every few steps: a starved helper stalls training).
  explicit AsyncWriter(bool lower_priority = true) : lower_priority_(lower_priority) {}
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Waits for the previous job (rethrowing its error), then starts `job` in the background.
  void submit(std::function<void()> job);
  // Blocks until no job is in flight; rethrows the last job's error once.
  void wait();
  bool busy() const;
  // No job in flight, and none failed since the last wait().
  bool succeeded() const;

 private:
  void loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;  // set: waiting for or being run by the thread
  bool running_ = false, quit_ = false;
  bool lower_priority_ = true;
  std::exception_ptr error_;
  std::thread thread_;  // started by the first submit()
};

}  // namespace ringtrain
