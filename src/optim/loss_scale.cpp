#include "ringtrain/optim/loss_scale.hpp"

#include <cmath>

#include "ringtrain/core/error.hpp"

namespace ringtrain {

LossScaler::LossScaler(const LossScaleConfig& cfg) : cfg_(cfg) {
  RT_CHECK(cfg.init_scale > 0 && cfg.growth >= 1 && cfg.backoff > 0 && cfg.backoff < 1 && cfg.interval > 0 &&
               cfg.min_scale > 0 && cfg.min_scale <= cfg.init_scale && cfg.init_scale <= cfg.max_scale,
           "loss scaling: need init_scale > 0, growth >= 1, 0 < backoff < 1, interval > 0 and "
           "0 < min_scale <= init_scale <= max_scale (got init ",
           cfg.init_scale, ", growth ", cfg.growth, ", backoff ", cfg.backoff, ", interval ", cfg.interval, ", min ",
           cfg.min_scale, ", max ", cfg.max_scale, ")");
  s_.scale = cfg.init_scale;
  s_.inv_scale = 1.0f / cfg.init_scale;
}

bool LossScaler::update(bool finite) {
  s_.found_inf = finite ? 0 : 1;
  loss_scale_step(s_, cfg_);
  return finite;
}

void LossScaler::save(double out[4]) const {
  out[0] = s_.scale;
  out[1] = s_.good_steps;
  out[2] = static_cast<double>(s_.steps);
  out[3] = static_cast<double>(s_.skipped);
}

void LossScaler::load(const double in[4]) {
  RT_CHECK(std::isfinite(in[0]) && in[0] >= cfg_.min_scale && in[0] <= cfg_.max_scale && in[1] >= 0 && in[2] >= 0 &&
               in[3] >= 0,
           "loss scaling: saved state {scale ", in[0], ", good steps ", in[1], "} is out of range [", cfg_.min_scale,
           ", ", cfg_.max_scale, "]");
  s_.scale = static_cast<float>(in[0]);
  s_.inv_scale = 1.0f / s_.scale;
  s_.good_steps = static_cast<int>(in[1]);
  s_.steps = static_cast<long long>(in[2]);
  s_.skipped = static_cast<long long>(in[3]);
  s_.found_inf = 0;
}

}  // namespace ringtrain
