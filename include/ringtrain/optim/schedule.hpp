#pragma once
// Learning-rate schedules: constant, step and cosine, each with an optional
// linear warm-up, and the linear scaling rule (Goyal et al. 2017).
//
// Rules kept here:
// - lr_at(step) is a pure function of the step index (0-based: the number of
//   optimizer steps already taken), so a resumed run gets the same lr.
// - Base lr = cfg.lr, times global_batch / reference_batch when linear_scaling.
//   min_lr (cosine) is absolute and is not scaled.
// - Durations (warmup, step_size, milestones) are in cfg.unit (epochs or steps)
//   and become step counts via steps_per_epoch (rounded to the nearest step).
// - Warm-up multiplies the main schedule by f + (1 − f)·step/W for step < W
//   (f = warmup_start_factor), reaching exactly the main value at step W.
//   Step decay counts milestones from step 0; cosine runs over [W, total]:
//   lr = min + (base − min)·(1 + cos(π·(s − W)/(total − W)))/2, min after total.
#include <cstdint>
#include <string>
#include <vector>

namespace ringtrain {

enum class ScheduleUnit { epochs, steps };
ScheduleUnit parse_schedule_unit(const std::string& s);  // "epochs"|"epoch"|"steps"|"step"

struct ScheduleConfig {
  std::string name = "constant";  // constant | step | cosine
  double lr = 0.1;                // base learning rate, before linear scaling
  bool linear_scaling = false;    // lr × global_batch / reference_batch
  std::int64_t global_batch = 256;
  std::int64_t reference_batch = 256;
  ScheduleUnit unit = ScheduleUnit::epochs;  // of warmup, step_size, milestones
  double warmup = 0.0;                       // warm-up length (0: none)
  double warmup_start_factor = 0.1;          // warm-up starts at factor × base lr
  double gamma = 0.1;                        // step: multiply by gamma at each boundary
  double step_size = 0.0;                    // step: a boundary every step_size (if no milestones)
  std::vector<double> milestones;            // step: boundaries (increasing)
  double min_lr = 0.0;                       // cosine: final learning rate
};

class LrSchedule {
 public:
  // Validates cfg (Error names the field); total_steps bounds the cosine.
  LrSchedule(const ScheduleConfig& cfg, std::int64_t steps_per_epoch, std::int64_t total_steps);

  double lr_at(std::int64_t step) const;
  double base_lr() const { return base_lr_; }
  std::int64_t warmup_steps() const { return warmup_steps_; }
  std::int64_t total_steps() const { return total_steps_; }
  const std::vector<std::int64_t>& boundaries() const { return boundaries_; }  // step schedule
  const ScheduleConfig& config() const { return cfg_; }

 private:
  enum class Kind { constant, step, cosine };
  double main_lr(std::int64_t step) const;

  ScheduleConfig cfg_;
  Kind kind_ = Kind::constant;
  double base_lr_ = 0.0;
  std::int64_t steps_per_epoch_ = 1, total_steps_ = 0, warmup_steps_ = 0, period_ = 0;
  std::vector<std::int64_t> boundaries_;
};

}  // namespace ringtrain
