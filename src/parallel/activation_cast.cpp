#include "ringtrain/parallel/activation_cast.hpp"

#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/model.hpp"

namespace ringtrain {

ActivationCast ActivationCast::choose(const ModelConfig& mc, Device dev, const std::vector<LayerPtr>& layers) {
  const Backend& be = backend_for(dev);
  const DType half = !mc.storage16                                        ? DType::f32
                     : mc.math == MathMode::bf16 && be.bf16_activations() ? DType::bf16
                     : mc.math == MathMode::fp16 && be.fp16_activations() ? DType::f16
                                                                          : DType::f32;
  bool all16 = half != DType::f32;
  for (const auto& l : layers) all16 = all16 && l->takes_bf16() && !(half == DType::f16 && l->takes_token_ids());
  ActivationCast c;
  c.act_ = all16 ? half : DType::f32;
  c.dev_ = dev;
  for (const auto& l : layers)
    if (l->takes_token_ids()) l->set_output_dtype(c.act_);
  return c;
}

Tensor ActivationCast::cast(Tensor& b, const Tensor& t, DType dt) const {
  if (t.dtype() == dt) return t;
  if (!b.defined() || b.shape() != t.shape() || b.dtype() != dt || b.device() != t.device())
    b = Tensor::empty(t.shape(), dt, t.device());
  backend_for(dev_).cast(t, b);
  return b;
}

}  // namespace ringtrain
