#pragma once
// uint8 CHW sample -> normalised float32 CHW, with optional random crop
// (zero padding, i.e. black before normalisation, as torchvision pads) and
// horizontal flip. The draw depends only on (seed, epoch, sample id).
// Normalisation is a per-channel 256-entry table: one load per pixel.
#include <cstdint>
#include <vector>

#include "ringtrain/data/loader.hpp"

namespace ringtrain::data {

class Transform {
 public:
  Transform() = default;
  Transform(std::int64_t C, std::int64_t H, std::int64_t W, const std::vector<double>& mean,
            const std::vector<double>& std, bool normalize, Augment aug, std::uint64_t seed);
  void apply(const std::uint8_t* src, float* dst, std::int64_t epoch, std::int64_t id) const;

 private:
  std::int64_t C_ = 0, H_ = 0, W_ = 0;
  std::vector<float> lut_;  // [C][256]
  Augment aug_;
  std::uint64_t seed_ = 0;
};

}  // namespace ringtrain::data
