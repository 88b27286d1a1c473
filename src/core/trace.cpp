#include "ringtrain/core/trace.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "ringtrain/core/error.hpp"

namespace ringtrain::trace {
namespace {

struct Event {
  const char* category;
  std::string name, args;
  std::int64_t t0_ns, t1_ns;
  int tid;
};

struct Recorder {
  std::atomic<bool> on{false};
  std::atomic<int> generation{0};  // a new window renumbers the threads
  std::mutex mu;
  std::vector<Event> events;
  std::vector<std::string> threads;  // tid -> name
  Clock::time_point origin;
};

Recorder& rec() {
  static Recorder r;
  return r;
}

struct ThreadSlot {
  int generation = -1, tid = 0;
};
thread_local ThreadSlot t_slot;
thread_local const char* t_name = nullptr;

// The calling thread's id in this window (under rec().mu).
int tid_locked(Recorder& r) {
  const int g = r.generation.load(std::memory_order_relaxed);
  if (t_slot.generation != g) {
    t_slot.generation = g;
    t_slot.tid = static_cast<int>(r.threads.size());
    r.threads.push_back(t_name ? t_name : cat("thread ", r.threads.size()));
  }
  return t_slot.tid;
}

std::int64_t ns_since(Clock::time_point origin, Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin).count();
}

std::int64_t parse_step(const std::string& s, const std::string& text) {
  std::size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  RT_CHECK(used == s.size() && !s.empty() && v >= 1, "configuration key 'log.trace_steps': '", text,
           "' is not a step window (FIRST-LAST or one step, steps counted from 1, e.g. \"100-105\")");
  return v;
}

}  // namespace

Window parse_window(const std::string& text) {
  Window w;
  if (text.empty()) return w;
  const std::size_t dash = text.find('-');
  w.first = parse_step(text.substr(0, dash), text);
  w.last = dash == std::string::npos ? w.first : parse_step(text.substr(dash + 1), text);
  RT_CHECK(w.last >= w.first, "configuration key 'log.trace_steps': '", text, "' ends (step ", w.last,
           ") before it begins (step ", w.first, ")");
  return w;
}

bool on() { return rec().on.load(std::memory_order_relaxed); }

void start() {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.clear();
  r.threads.clear();
  r.generation.fetch_add(1, std::memory_order_relaxed);
  name_thread("main");
  r.origin = Clock::now();
  r.on.store(true, std::memory_order_release);
}

void name_thread(const char* name) {
  t_name = name;
  t_slot.generation = -1;  // renamed: takes a new id at its next span
}

void span(const char* category, std::string name, Clock::time_point t0, Clock::time_point t1, std::string args) {
  Recorder& r = rec();
  if (!r.on.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.on.load(std::memory_order_relaxed)) return;
  r.events.push_back({category, std::move(name), std::move(args), ns_since(r.origin, t0), ns_since(r.origin, t1),
                      tid_locked(r)});
}

std::string stop(int pid, std::size_t* count) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  r.on.store(false, std::memory_order_release);
  std::string out;
  auto add = [&](const nlohmann::json& e) {
    if (!out.empty()) out += ",\n";
    out += e.dump();
  };
  for (std::size_t t = 0; t < r.threads.size(); ++t)
    add({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", t}, {"args", {{"name", r.threads[t]}}}});
  for (const Event& e : r.events) {
    nlohmann::json j = {{"name", e.name},
                        {"cat", e.category},
                        {"ph", "X"},
                        {"pid", pid},
                        {"tid", e.tid},
                        {"ts", static_cast<double>(e.t0_ns) / 1e3},  // microseconds
                        {"dur", static_cast<double>(e.t1_ns - e.t0_ns) / 1e3}};
    if (!e.args.empty()) {
      nlohmann::json a = nlohmann::json::parse("{" + e.args + "}", nullptr, /*allow_exceptions=*/false);
      j["args"] = a.is_discarded() ? nlohmann::json{{"text", e.args}} : a;  // a name with a quote in it
    }
    add(j);
  }
  if (count) *count = r.events.size();
  r.events.clear();
  return out;
}

Scope::Scope(const char* category, const char* name, int a, int b)
    : category_(category), name_(name), a_(a), b_(b), on_(trace::on()) {
  if (on_) t0_ = Clock::now();
}

Scope::~Scope() {
  if (!on_) return;
  const auto t1 = Clock::now();
  std::string n = name_;
  if (a_ >= 0) n += cat(" ", a_);
  if (b_ >= 0) n += cat(".", b_);
  span(category_, std::move(n), t0_, t1);
}

}  // namespace ringtrain::trace
