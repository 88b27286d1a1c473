#include "ringtrain/core/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ringtrain::log {
namespace {

struct State {
  std::mutex mu;
  int rank = 0;
  int size = 1;
  std::string prefix;  // replaces "[rank N] " when set
  std::atomic<int> level{static_cast<int>(Level::info)};
  std::atomic<bool> all_ranks{false};
  State() {
    if (const char* v = std::getenv("RINGTRAIN_LOG")) {
      if (!std::strcmp(v, "debug")) level = static_cast<int>(Level::debug);
      else if (!std::strcmp(v, "warn")) level = static_cast<int>(Level::warn);
      else if (!std::strcmp(v, "error")) level = static_cast<int>(Level::error);
    }
  }
};

State& state() {
  static State s;
  return s;
}

}  // namespace

void set_rank(int rank, int size) {
  std::lock_guard lk(state().mu);
  state().rank = rank;
  state().size = size;
}
void set_level(Level l) { state().level = static_cast<int>(l); }
void set_prefix(const std::string& prefix) {
  std::lock_guard lk(state().mu);
  state().prefix = prefix;
}
void set_all_ranks(bool all) { state().all_ranks = all; }

void write(Level l, const std::string& msg) {
  auto& s = state();
  if (static_cast<int>(l) < s.level) return;
  if (l <= Level::info && s.rank != 0 && !s.all_ranks) return;
  static const char* tags[] = {"debug", "info", "warning", "error"};
  // One write per line, so lines of different ranks never interleave mid-line.
  std::string line;
  {
    std::lock_guard lk(s.mu);
    line = !s.prefix.empty() ? s.prefix : s.size > 1 ? cat("[rank ", s.rank, "] ") : std::string();
  }
  line += l == Level::info ? msg : cat(tags[static_cast<int>(l)], ": ", msg);
  line += '\n';
  std::lock_guard lk(s.mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace ringtrain::log
