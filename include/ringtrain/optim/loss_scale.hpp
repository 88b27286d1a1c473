#pragma once
// Dynamic loss scaling for fp16 training (torch.cuda.amp.GradScaler's rule):
//   the loss gradient is multiplied by scale() before backward; after the
//   gradient all-reduce, unscale_grads(1/scale) reports whether every gradient
//   is finite; update(finite) then either keeps the step (and grows the scale
//   after `interval` good steps in a row) or skips it and multiplies the scale
//   by `backoff`. The decision is taken on reduced — hence identical — gradients,
//   so every rank skips the same steps.
// loss_scale_step() is the rule itself (RT_HD, usable from a kernel).
#include <cstdint>

#include "ringtrain/core/hd.hpp"

namespace ringtrain {

struct LossScaleConfig {
  float init_scale = 65536.0f;
  float growth = 2.0f;
  float backoff = 0.5f;
  int interval = 2000;  // good steps before the scale grows
  float min_scale = 1.0f;
  float max_scale = 16777216.0f;  // 2^24
};

struct LossScaleState {
  float scale = 1.0f;
  float inv_scale = 1.0f;
  int good_steps = 0;
  int found_inf = 0;  // set by the check before the step
  long long steps = 0;
  long long skipped = 0;
};

RT_HD void loss_scale_step(LossScaleState& s, const LossScaleConfig& c) {
  if (s.found_inf) {
    float v = s.scale * c.backoff;
    s.scale = v < c.min_scale ? c.min_scale : v;
    s.good_steps = 0;
    ++s.skipped;
  } else if (++s.good_steps >= c.interval) {
    float v = s.scale * c.growth;
    s.scale = v > c.max_scale ? c.max_scale : v;
    s.good_steps = 0;
  }
  s.inv_scale = 1.0f / s.scale;
  s.found_inf = 0;
  ++s.steps;
}

class LossScaler {
 public:
  // Throws Error unless init_scale > 0, growth >= 1, 0 < backoff < 1, interval > 0, min <= init <= max.
  explicit LossScaler(const LossScaleConfig& cfg = {});
  float scale() const { return s_.scale; }
  float inv_scale() const { return s_.inv_scale; }
  // Applies the rule for one step; returns `finite` (true: take the optimizer step).
  bool update(bool finite);
  const LossScaleState& state() const { return s_; }
  const LossScaleConfig& config() const { return cfg_; }
  // Checkpoint round trip: {scale, good_steps, steps, skipped} as doubles.
  void save(double out[4]) const;
  void load(const double in[4]);

 private:
  LossScaleConfig cfg_;
  LossScaleState s_;
};

}  // namespace ringtrain
