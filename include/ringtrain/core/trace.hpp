#pragma once
// A trace of a window of training steps that a person can open: every rank's
// compute, communication, waits and data reading as spans on its threads, in
// one Chrome-trace / Perfetto JSON file (log.trace_steps, log.trace).
//
// Horovod's timeline is rank 0's engine only and grows with the run; this one
// covers every rank but only the steps asked for, so its size is a few steps'
// worth whatever the run's length. Outside the window the cost is one relaxed
// atomic load per would-be span; inside it, two clock reads and one append
// under a lock (bench/trace_overhead.sh measures both against an untraced run).
//
// One recorder per process, like the flight recorder: the engine's thread and
// the collectives record into it without a context argument.
//
// Clocks: each rank's times are relative to its own start of the window (the
// first traced step's start, which every rank reaches after the previous
// step's all-reduce), so ranks line up to within that all-reduce's exit skew.
#include <chrono>
#include <cstdint>
#include <string>

namespace ringtrain::trace {

using Clock = std::chrono::steady_clock;

// Optimizer steps first..last, both inclusive, counted from 1 over the whole run.
struct Window {
  std::int64_t first = 0, last = -1;
  bool empty() const { return last < first; }
  bool contains(std::int64_t step) const { return step >= first && step <= last; }
};
// "100-105", "7" (one step) or "" (no trace); throws Error naming log.trace_steps.
Window parse_window(const std::string& text);

bool on();
// Begins recording on this rank (the calling thread is named "main"); spans of
// an earlier window are dropped.
void start();
// Stops recording and returns this rank's spans as Chrome-trace events (JSON
// objects separated by commas, pid = `pid`, thread names included); `count`
// receives the number of spans. train/trace_file.hpp gathers them into a file.
std::string stop(int pid, std::size_t* count = nullptr);

// Names the calling thread in the trace ("engine", "loader", ...).
void name_thread(const char* name);

// Records [t0, t1] on the calling thread. `args` is a JSON object's members
// without braces ("\"bytes\": 64") or empty.
void span(const char* category, std::string name, Clock::time_point t0, Clock::time_point t1,
          std::string args = {});

// A span from construction to destruction, recorded only when tracing was on
// at construction. The name is built only then: pass parts, not a string.
class Scope {
 public:
  Scope(const char* category, const char* name, int a = -1, int b = -1);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* category_;
  const char* name_;
  int a_, b_;
  bool on_;
  Clock::time_point t0_;
};

}  // namespace ringtrain::trace
