#include "transform.hpp"

#include "rng.hpp"

namespace ringtrain::data {

Transform::Transform(std::int64_t C, std::int64_t H, std::int64_t W, const std::vector<double>& mean,
                     const std::vector<double>& std, bool normalize, Augment aug, std::uint64_t seed)
    : C_(C), H_(H), W_(W), lut_(std::size_t(C) * 256), aug_(aug), seed_(seed) {
  for (std::int64_t c = 0; c < C; ++c)
    for (int v = 0; v < 256; ++v)
      lut_[c * 256 + v] = normalize ? float((v / 255.0 - mean[c]) / std[c]) : float(v);
}

void Transform::apply(const std::uint8_t* src, float* dst, std::int64_t epoch, std::int64_t id) const {
  const std::int64_t plane = H_ * W_;
  if (aug_.crop_padding <= 0 && !aug_.hflip) {
    for (std::int64_t c = 0; c < C_; ++c) {
      const float* lut = &lut_[c * 256];
      for (std::int64_t i = 0; i < plane; ++i) dst[c * plane + i] = lut[src[c * plane + i]];
    }
    return;
  }
  std::uint64_t s = mix_seed(seed_, std::uint64_t(epoch), std::uint64_t(id), 0xa06);
  auto draw = [&] { return splitmix64(s); };
  const std::int64_t P = aug_.crop_padding > 0 ? aug_.crop_padding : 0;
  const std::int64_t dy = P ? std::int64_t(uniform_below(draw, std::uint64_t(2 * P + 1))) - P : 0;
  const std::int64_t dx = P ? std::int64_t(uniform_below(draw, std::uint64_t(2 * P + 1))) - P : 0;
  const bool flip = aug_.hflip && (draw() >> 63);
  for (std::int64_t c = 0; c < C_; ++c) {
    const float* lut = &lut_[c * 256];
    const float pad = lut[0];
    for (std::int64_t y = 0; y < H_; ++y) {
      float* out = dst + c * plane + y * W_;
      const std::int64_t sy = y + dy;
      if (sy < 0 || sy >= H_) {
        for (std::int64_t x = 0; x < W_; ++x) out[x] = pad;
        continue;
      }
      const std::uint8_t* row = src + c * plane + sy * W_;
      for (std::int64_t x = 0; x < W_; ++x) {
        const std::int64_t sx = (flip ? W_ - 1 - x : x) + dx;
        out[x] = (sx < 0 || sx >= W_) ? pad : lut[row[sx]];
      }
    }
  }
}

}  // namespace ringtrain::data
