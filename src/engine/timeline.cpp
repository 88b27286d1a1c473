#include "timeline.hpp"

#include <nlohmann/json.hpp>

#include "ringtrain/core/error.hpp"

namespace ringtrain::engine {

Timeline::Timeline(const std::string& path, int rank, Clock::time_point origin)
    : path_(path), rank_(rank), origin_(origin) {
  f_ = std::fopen(path.c_str(), "w");
  RT_CHECK(f_ != nullptr, "timeline: cannot open '", path, "' for writing (comm.timeline)");
  std::fprintf(f_, "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}}",
               rank_, rank_);
  thread_ = std::thread([this] { run(); });
}

Timeline::~Timeline() { close(); }

void Timeline::span(const std::string& tensor, const char* phase, Clock::time_point begin,
                    Clock::time_point end, std::string args) {
  using us = std::chrono::duration<double, std::micro>;
  Event e{tensor, phase, us(begin - origin_).count(), us(end - begin).count(), std::move(args)};
  {
    std::lock_guard lk(mu_);
    if (stop_) return;
    q_.push_back(std::move(e));
  }
  cv_.notify_one();
}

void Timeline::close() {
  {
    std::lock_guard lk(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  std::fprintf(f_, "\n]\n");
  std::fclose(f_);
  f_ = nullptr;
}

void Timeline::run() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
    std::deque<Event> batch;
    batch.swap(q_);
    bool stopping = stop_;
    lk.unlock();
    for (const auto& e : batch) write_event(e);
    std::fflush(f_);
    lk.lock();
    if (stopping && q_.empty()) return;
  }
}

void Timeline::write_event(const Event& e) {
  auto [it, fresh] = tids_.try_emplace(e.tensor, static_cast<int>(tids_.size()) + 1);
  int tid = it->second;
  if (fresh) {
    std::string name = nlohmann::json(e.tensor).dump();
    std::fprintf(f_, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": %s}}",
                 rank_, tid, name.c_str());
  }
  std::fprintf(f_, ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f",
               e.phase, rank_, tid, e.ts_us, e.dur_us < 0 ? 0.0 : e.dur_us);
  if (!e.args.empty()) std::fprintf(f_, ", \"args\": {%s}", e.args.c_str());
  std::fprintf(f_, "}");
}

}  // namespace ringtrain::engine
