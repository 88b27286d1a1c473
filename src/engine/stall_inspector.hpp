#pragma once
// StallInspector (coordinator only): watches names that some ranks submitted
// and others did not, warns after `warn_s` and, with `shutdown_s` > 0, asks for
// the engine to stop after `shutdown_s`.
//
// Rules: update() runs every cycle with the names currently partial (a
// negotiation-table entry or a cached name whose bit is set on some ranks
// only); due() says a full negotiation round is needed to learn the missing
// ranks; check() runs in that round with each partial name's per-rank presence
// and returns the texts the coordinator broadcasts. A name warns at most once
// per `warn_s`. Times come from the coordinator's clock only, so every rank
// acts on the same decision.
#include <chrono>
#include <string>
#include <unordered_map>
#include <vector>

namespace ringtrain::engine {

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;
  StallInspector(double warn_s, double shutdown_s) : warn_s_(warn_s), shutdown_s_(shutdown_s) {}
  bool enabled() const { return warn_s_ > 0 || shutdown_s_ > 0; }

  void update(const std::vector<std::string>& partial, Clock::time_point now);
  bool due(Clock::time_point now) const;

  struct Presence {
    std::string name;
    std::vector<bool> present;  // per rank
  };
  struct Verdict {
    std::vector<std::string> warnings;
    std::string shutdown;  // non-empty: stop the engine with this message
  };
  Verdict check(const std::vector<Presence>& partial, Clock::time_point now);

 private:
  struct Entry {
    Clock::time_point first_seen, last_warned;
    bool warned = false;
  };
  double age(const Entry& e, Clock::time_point now) const {
    return std::chrono::duration<double>(now - e.first_seen).count();
  }
  bool warn_due(const Entry& e, Clock::time_point now) const;
  double warn_s_, shutdown_s_;
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace ringtrain::engine
