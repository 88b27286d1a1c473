// Learning-rate schedules (see schedule.hpp for the exact formulas).
#include "ringtrain/optim/schedule.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numbers>

#include "ringtrain/core/error.hpp"

namespace ringtrain {

namespace {
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
}  // namespace

ScheduleUnit parse_schedule_unit(const std::string& s) {
  const std::string l = lower(s);
  if (l == "epochs" || l == "epoch") return ScheduleUnit::epochs;
  if (l == "steps" || l == "step") return ScheduleUnit::steps;
  RT_FAIL("unknown schedule unit '", s, "' (expected epochs or steps)");
}

LrSchedule::LrSchedule(const ScheduleConfig& cfg, std::int64_t steps_per_epoch, std::int64_t total_steps)
    : cfg_(cfg), steps_per_epoch_(steps_per_epoch), total_steps_(total_steps) {
  const std::string name = lower(cfg.name);
  if (name == "constant") kind_ = Kind::constant;
  else if (name == "step") kind_ = Kind::step;
  else if (name == "cosine") kind_ = Kind::cosine;
  else RT_FAIL("unknown lr schedule '", cfg.name, "' (expected constant, step or cosine)");
  cfg_.name = name;
  RT_CHECK(steps_per_epoch > 0, "lr schedule: steps_per_epoch must be > 0, got ", steps_per_epoch);
  RT_CHECK(total_steps >= 0, "lr schedule: total_steps must be >= 0, got ", total_steps);
  RT_CHECK(std::isfinite(cfg.lr) && cfg.lr >= 0, "lr schedule: lr must be finite and >= 0, got ", cfg.lr);
  base_lr_ = cfg.lr;
  if (cfg.linear_scaling) {
    RT_CHECK(cfg.global_batch > 0 && cfg.reference_batch > 0, "lr schedule: linear scaling needs global_batch > 0 and "
             "reference_batch > 0, got ", cfg.global_batch, " and ", cfg.reference_batch);
    base_lr_ = cfg.lr * static_cast<double>(cfg.global_batch) / static_cast<double>(cfg.reference_batch);
  }
  const double unit = cfg.unit == ScheduleUnit::epochs ? static_cast<double>(steps_per_epoch) : 1.0;
  auto to_steps = [&](double x, const char* field) {
    RT_CHECK(std::isfinite(x) && x >= 0, "lr schedule: ", field, " must be finite and >= 0, got ", x);
    return static_cast<std::int64_t>(std::llround(x * unit));
  };
  warmup_steps_ = to_steps(cfg.warmup, "warmup");
  RT_CHECK(cfg.warmup_start_factor >= 0 && cfg.warmup_start_factor <= 1,
           "lr schedule: warmup_start_factor must be in [0, 1], got ", cfg.warmup_start_factor);
  if (kind_ == Kind::step) {
    RT_CHECK(std::isfinite(cfg.gamma) && cfg.gamma > 0, "lr schedule 'step': gamma must be > 0, got ", cfg.gamma);
    if (!cfg.milestones.empty()) {
      for (double m : cfg.milestones) {
        std::int64_t s = to_steps(m, "milestone");
        RT_CHECK(boundaries_.empty() || s > boundaries_.back(), "lr schedule 'step': milestones must increase "
                 "strictly (in steps); ", m, " does not");
        boundaries_.push_back(s);
      }
    } else {
      period_ = to_steps(cfg.step_size, "step_size");
      RT_CHECK(period_ > 0, "lr schedule 'step': needs milestones or step_size > 0 (got step_size ", cfg.step_size, ")");
    }
  }
  if (kind_ == Kind::cosine) {
    RT_CHECK(total_steps > warmup_steps_, "lr schedule 'cosine': total_steps (", total_steps,
             ") must exceed the warm-up steps (", warmup_steps_, ")");
    RT_CHECK(std::isfinite(cfg.min_lr) && cfg.min_lr >= 0, "lr schedule 'cosine': min_lr must be >= 0, got ", cfg.min_lr);
  }
}

double LrSchedule::main_lr(std::int64_t s) const {
  switch (kind_) {
    case Kind::constant: return base_lr_;
    case Kind::step: {
      std::int64_t k = period_ > 0 ? s / period_
                                   : std::upper_bound(boundaries_.begin(), boundaries_.end(), s) - boundaries_.begin();
      return base_lr_ * std::pow(cfg_.gamma, static_cast<double>(k));
    }
    case Kind::cosine: {
      if (s <= warmup_steps_) return base_lr_;
      if (s >= total_steps_) return cfg_.min_lr;
      const double x = static_cast<double>(s - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_);
      return cfg_.min_lr + (base_lr_ - cfg_.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * x));
    }
  }
  return base_lr_;
}

double LrSchedule::lr_at(std::int64_t step) const {
  RT_CHECK(step >= 0, "lr schedule: step must be >= 0, got ", step);
  double lr = main_lr(step);
  if (step < warmup_steps_) {
    const double f = cfg_.warmup_start_factor;
    lr *= f + (1.0 - f) * static_cast<double>(step) / static_cast<double>(warmup_steps_);
  }
  return lr;
}

}  // namespace ringtrain
