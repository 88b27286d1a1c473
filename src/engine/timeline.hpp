#pragma once
// Timeline: Chrome trace JSON written by its own thread, so the engine thread
// only enqueues (name, phase, begin, end) and never waits for the disk.
//
// Rules: the file is a JSON array from the first byte written to close(): "["
// at open, "," between events, "]" at close (the destructor closes). pid is the
// rank; each tensor name gets its own row (tid), labelled by a thread_name
// metadata event when first seen. Times are microseconds since `origin`.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

namespace ringtrain::engine {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  // Opens `path` for writing (Error naming it when that fails).
  Timeline(const std::string& path, int rank, Clock::time_point origin);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // A complete ("X") event on the row of `tensor`; `args` is a JSON object
  // body without braces (e.g. "\"bytes\": 12") or empty.
  void span(const std::string& tensor, const char* phase, Clock::time_point begin, Clock::time_point end,
            std::string args = {});
  void close();
  const std::string& path() const { return path_; }

 private:
  struct Event {
    std::string tensor;
    const char* phase;
    double ts_us, dur_us;
    std::string args;
  };
  void run();
  void write_event(const Event& e);

  std::string path_;
  int rank_;
  Clock::time_point origin_;
  std::FILE* f_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> q_;
  bool stop_ = false;
  std::unordered_map<std::string, int> tids_;  // writer thread only
  std::thread thread_;
};

}  // namespace ringtrain::engine
