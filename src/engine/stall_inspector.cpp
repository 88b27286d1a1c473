#include "stall_inspector.hpp"

#include <unordered_set>

#include "message.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain::engine {

void StallInspector::update(const std::vector<std::string>& partial, Clock::time_point now) {
  if (!enabled()) return;
  std::unordered_set<std::string> live(partial.begin(), partial.end());
  for (auto it = entries_.begin(); it != entries_.end();)
    it = live.count(it->first) ? std::next(it) : entries_.erase(it);
  for (const auto& n : partial) entries_.try_emplace(n, Entry{now, now, false});
}

bool StallInspector::warn_due(const Entry& e, Clock::time_point now) const {
  if (warn_s_ <= 0 || age(e, now) < warn_s_) return false;
  return !e.warned || std::chrono::duration<double>(now - e.last_warned).count() >= warn_s_;
}

bool StallInspector::due(Clock::time_point now) const {
  for (const auto& [n, e] : entries_) {
    if (warn_due(e, now)) return true;
    if (shutdown_s_ > 0 && age(e, now) >= shutdown_s_) return true;
  }
  return false;
}

StallInspector::Verdict StallInspector::check(const std::vector<Presence>& partial, Clock::time_point now) {
  Verdict v;
  if (!enabled()) return v;
  int stalled = 0;
  for (const auto& p : partial) {
    auto it = entries_.find(p.name);
    if (it == entries_.end()) continue;
    Entry& e = it->second;
    std::vector<int> have, missing;
    for (int r = 0; r < static_cast<int>(p.present.size()); ++r) (p.present[r] ? have : missing).push_back(r);
    if (missing.empty() || have.empty()) continue;
    double a = age(e, now);
    if (shutdown_s_ > 0 && a >= shutdown_s_) {
      ++stalled;
      if (v.shutdown.empty())
        v.shutdown = cat("stall shutdown: allreduce '", p.name, "' was submitted by ", ranks_str(have),
                         " but not by ", ranks_str(missing), " for ", static_cast<int>(a * 10) / 10.0,
                         " s (limit ", shutdown_s_, " s, comm.stall_shutdown_s); "
                         "the engine stopped on every rank");
      continue;
    }
    if (warn_due(e, now)) {
      v.warnings.push_back(cat("stall: allreduce '", p.name, "' was submitted by ", ranks_str(have),
                               " but not by ", ranks_str(missing), " for ", static_cast<int>(a * 10) / 10.0,
                               " s (warning after ", warn_s_, " s, comm.stall_warning_s); "
                               "check that every rank submits the same tensor names"));
      e.warned = true;
      e.last_warned = now;
    }
  }
  if (stalled > 1) v.shutdown += cat(" (", stalled - 1, " more tensor(s) stalled as well)");
  // Names that were due but turned out complete or unknown this round must not
  // force a full round every cycle.
  for (auto& [n, e] : entries_)
    if (warn_due(e, now)) {
      e.warned = true;
      e.last_warned = now;
    }
  return v;
}

}  // namespace ringtrain::engine
