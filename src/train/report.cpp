#include "ringtrain/train/report.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/train/straggler.hpp"

namespace ringtrain {

Reporter::Reporter(bool root, const std::string& format, int interval, const std::string& metrics_path,
                   int epochs, std::int64_t steps_per_epoch)
    : root_(root), interval_(interval), epochs_(epochs), steps_(steps_per_epoch) {
  bar_ = format == "bar" || (format == "auto" && ::isatty(STDERR_FILENO));
  json_ = format == "json";
  if (root_ && !metrics_path.empty()) {
    auto parent = std::filesystem::path(metrics_path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    metrics_ = std::fopen(metrics_path.c_str(), "a");
    RT_CHECK(metrics_ != nullptr, "cannot open metrics file '", metrics_path, "' for appending");
  }
}

Reporter::~Reporter() {
  if (metrics_) std::fclose(metrics_);
}

void Reporter::epoch_start(int epoch) {
  epoch_ = epoch;
  epoch_t0_ = std::chrono::steady_clock::now();
}

static std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

static std::string hms(double s) {
  int t = static_cast<int>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%d:%02d", t / 60, t % 60);
  return buf;
}

void Reporter::step(std::int64_t s, double loss, double images_per_s, const StepLive& live) {
  if (!root_) return;
  const char* unit = tokens_ > 0 ? "tokens/s" : "img/s";
  if (tokens_ > 0) images_per_s *= double(tokens_);
  std::string extra;
  if (live.mfu > 0) extra += cat(" MFU ", fixed(100 * live.mfu, 1), "%");
  if (live.peak_bytes > 0) extra += cat(" peak ", fixed(live.peak_bytes / (1 << 20), 0), " MiB");
  if (live.slowest_rank >= 0)
    extra += cat(" slowest rank ", live.slowest_rank, " ", fixed(live.slowest_slowdown, 2), "x");
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_t0_).count();
  double eta = s > 0 ? elapsed / s * (steps_ - s) : 0;
  if (bar_) {
    const int width = 30;
    int filled = steps_ ? static_cast<int>(width * s / steps_) : width;
    std::string bar(filled, '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\repoch %d/%d [%s] %3d%% loss %.4f %7.0f %s%s ETA %s   ", epoch_ + 1, epochs_,
                 bar.c_str(), steps_ ? static_cast<int>(100 * s / steps_) : 100, loss, images_per_s, unit,
                 extra.c_str(), hms(eta).c_str());
    std::fflush(stderr);
  } else if (json_ && (s % interval_ == 0 || s == steps_)) {
    // The loss at full precision, for comparing runs step by step.
    nlohmann::json j = {{"event", "step"}, {"epoch", epoch_ + 1}, {"step", epoch_ * steps_ + s},
                        {"step_in_epoch", s}, {"loss", loss},     {tokens_ > 0 ? "tokens_per_s" : "images_per_s", images_per_s}};
    if (live.mfu > 0) j["mfu"] = live.mfu;
    if (live.peak_bytes > 0) j["peak_host_tensor_bytes"] = live.peak_bytes;
    if (live.slowest_rank >= 0) {
      j["slowest_rank"] = live.slowest_rank;
      j["slowest_slowdown"] = live.slowest_slowdown;
    }
    std::fprintf(stderr, "%s\n", j.dump().c_str());
  } else if (!json_ && (s % interval_ == 0 || s == steps_)) {
    std::fprintf(stderr, "epoch %d/%d step %lld/%lld loss %.4f %.0f %s%s ETA %s\n", epoch_ + 1, epochs_,
                 static_cast<long long>(s), static_cast<long long>(steps_), loss, images_per_s, unit, extra.c_str(),
                 hms(eta).c_str());
  }
}

void Reporter::epoch_end(const EpochMetrics& m) {
  if (!root_) return;
  if (bar_) std::fprintf(stderr, "\n");
  std::string test = m.evaluated ? cat(" | test loss ", fixed(m.test_loss, 4), " acc ", fixed(100 * m.test_accuracy, 2), "%")
                                 : std::string();
  // A language model: the test split is the validation set; perplexity = exp(mean token loss).
  if (m.evaluated && m.tokens_per_sample > 0)
    test = cat(" | val loss ", fixed(m.test_loss, 4), " ppl ", fixed(std::exp(m.test_loss), 2), " acc ",
               fixed(100 * m.test_accuracy, 2), "%");
  std::string rate = m.tokens_per_sample > 0
                         ? cat(fixed(m.images_per_s * double(m.tokens_per_sample), 0), " tokens/s")
                         : cat(fixed(m.images_per_s, 0), " img/s");
  if (m.matmul_peak_flops > 0)
    rate += cat(", model ", fixed(m.model_flops_per_s / 1e9, 2), " GFLOP/s = MFU ",
                fixed(100 * m.model_flops_per_s / m.matmul_peak_flops, 1), "% of the measured matmul peak ",
                fixed(m.matmul_peak_flops / 1e9, 1), " GFLOP/s");
  if (m.schedule_s > 0)
    rate += cat(" | pipeline schedule ", fixed(1e3 * m.schedule_s, 1), " ms/step (median ",
                fixed(1e3 * m.schedule_median_s, 1), "), simulator ", fixed(1e3 * m.schedule_predicted_s, 1), " ms (bubble ",
                fixed(100 * m.schedule_bubble_predicted, 0), "%; messages ", fixed(1e6 * m.pipeline_message_s, 0),
                " us; ", fixed(1e3 * m.schedule_predicted_free_s, 1), " ms with free messages; ",
                fixed(1e3 * m.schedule_predicted_steps_s, 1), " ms from per-step costs, median ",
                fixed(1e3 * m.schedule_predicted_steps_median_s, 1), "; the busiest rank computes ",
                fixed(1e3 * m.schedule_busiest_s, 1), " ms)");
  std::string moe;
  for (const MoeEpochStats& s : m.moe)
    moe += cat(" | ", s.layer, " aux ", fixed(s.aux, 3), " max/mean ", fixed(s.max_over_mean, 2), " (epoch ",
               fixed(s.epoch_max_over_mean, 2), ") dropped ",
               fixed(100 * s.dropped_fraction, 1), "%");
  if (m.moe_alltoall_s > 0)
    moe += cat(" | expert all-to-all ", fixed(m.moe_alltoall_s, 2), "s exposed of ", fixed(m.moe_alltoall_span_s, 2),
               "s in flight");
  std::string amp = m.loss_scale > 0 ? cat(" | loss scale ", m.loss_scale, ", ", m.skipped_steps, " skipped") : "";
  std::string slow = m.slowest_rank < 0 ? ""
                     : cat(" | ", m.straggler ? "straggler" : "slowest", " rank ", m.slowest_rank, ": compute ",
                           fixed(m.slowest_slowdown, 2), "x the median, others waited ",
                           fixed(100 * m.slowest_wait_fraction, 0), "% of the step");
  if (!json_)  // json: the epoch record below instead
    std::fprintf(stderr,
                 "epoch %d/%d: train loss %.4f acc %.2f%%%s | %s | "
                 "compute %.1fs, exposed comm %.2fs, data wait %.2fs | lr %.4g%s%s%s\n",
                 m.epoch + 1, epochs_, m.train_loss, 100 * m.train_accuracy, test.c_str(), rate.c_str(), m.compute_s,
                 m.comm_exposed_s, m.data_wait_s, m.lr, amp.c_str(), slow.c_str(), moe.c_str());
  std::fflush(stderr);
  if (metrics_ || json_) {
    nlohmann::json j = {{"event", "epoch"},
                        {"epoch", m.epoch + 1},
                        {"step", m.step},
                        {"lr", m.lr},
                        {"train_loss", m.train_loss},
                        {"train_accuracy", m.train_accuracy},
                        {"test_loss", m.evaluated ? nlohmann::json(m.test_loss) : nlohmann::json()},
                        {"test_accuracy", m.evaluated ? nlohmann::json(m.test_accuracy) : nlohmann::json()},
                        {"images_per_s", m.images_per_s},
                        {"time_s", m.time_s},
                        {"compute_s", m.compute_s},
                        {"comm_exposed_s", m.comm_exposed_s},
                        {"pipeline_wait_s", m.pipeline_wait_s},
                        {"data_wait_s", m.data_wait_s},
                        {"eval_s", m.eval_s}};
    if (m.tokens_per_sample > 0) {
      j["tokens_per_s"] = m.images_per_s * double(m.tokens_per_sample);
      j["test_perplexity"] = m.evaluated ? nlohmann::json(std::exp(m.test_loss)) : nlohmann::json();
    }
    if (m.matmul_peak_flops > 0) {
      j["model_flops_per_s"] = m.model_flops_per_s;
      j["matmul_peak_flops"] = m.matmul_peak_flops;
      j["mfu"] = m.model_flops_per_s / m.matmul_peak_flops;
    }
    const bool slowest = m.slowest_rank >= 0;
    j["slowest_rank"] = slowest ? nlohmann::json(m.slowest_rank) : nlohmann::json();
    j["slowest_slowdown"] = slowest ? nlohmann::json(m.slowest_slowdown) : nlohmann::json();
    j["slowest_wait_fraction"] = slowest ? nlohmann::json(m.slowest_wait_fraction) : nlohmann::json();
    j["straggler"] = m.straggler ? nlohmann::json(m.slowest_rank) : nlohmann::json();
    if (m.schedule_s > 0) {
      j["schedule_s"] = m.schedule_s;
      j["schedule_predicted_s"] = m.schedule_predicted_s;
      j["schedule_bubble_predicted"] = m.schedule_bubble_predicted;
      for (const auto& c : m.schedule_stage_fiw) j["schedule_stage_fiw"].push_back({c[0], c[1], c[2], c[3]});
      j["schedule_predicted_free_s"] = m.schedule_predicted_free_s;
      j["pipeline_message_s"] = m.pipeline_message_s;
      j["schedule_predicted_steps_s"] = m.schedule_predicted_steps_s;
      j["schedule_median_s"] = m.schedule_median_s;
      j["schedule_predicted_steps_median_s"] = m.schedule_predicted_steps_median_s;
      j["schedule_busiest_s"] = m.schedule_busiest_s;
    }
    if (m.moe_alltoall_s > 0) {
      j["moe_alltoall_s"] = m.moe_alltoall_s;
      j["moe_alltoall_span_s"] = m.moe_alltoall_span_s;
    }
    for (const MoeEpochStats& s : m.moe)
      j["moe"][s.layer] = {{"aux", s.aux}, {"max_over_mean", s.max_over_mean},
                            {"epoch_max_over_mean", s.epoch_max_over_mean}, {"dropped_fraction", s.dropped_fraction}};
    if (m.loss_scale > 0) {
      j["loss_scale"] = m.loss_scale;
      j["skipped_steps"] = m.skipped_steps;
    }
    if (json_) std::fprintf(stderr, "%s\n", j.dump().c_str());
    json_line(std::move(j));
  }
}

void Reporter::straggler(const SlowestRank& s, std::int64_t step, int intervals, int interval, double factor) {
  if (!root_) return;
  nlohmann::json j = {{"event", "straggler"}, {"rank", s.rank},       {"slowdown", s.slowdown},
                      {"wait_fraction", s.wait_fraction}, {"step", step}, {"intervals", intervals},
                      {"interval_steps", interval}, {"factor", factor}};
  if (bar_) std::fprintf(stderr, "\n");  // off the progress bar's line
  if (json_) std::fprintf(stderr, "%s\n", j.dump().c_str());
  else
    log::warn("straggler: rank ", s.rank, " computed more than comm.straggler_factor = ", factor,
              " times as long as the median of its peers in each of the last ", intervals, " intervals of ", interval,
              " steps (up to step ", step, "; ", fixed(s.slowdown, 2), "x in the last); the other ranks spent ",
              fixed(100 * s.wait_fraction, 0), "% of their step time waiting on it");
  json_line(std::move(j));
}

void Reporter::set_run(const std::string& run_id, std::int64_t resumes) {
  run_id_ = run_id;
  resumes_ = resumes;
}

void Reporter::json_line(nlohmann::json j) {
  if (!metrics_) return;
  if (!run_id_.empty()) {
    j["run"] = run_id_;
    j["resume"] = resumes_;
  }
  std::fprintf(metrics_, "%s\n", j.dump().c_str());
  std::fflush(metrics_);
}

}  // namespace ringtrain
