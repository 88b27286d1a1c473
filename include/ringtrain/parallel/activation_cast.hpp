#pragma once
// ActivationCast: a stage's 16-bit activation storage, as a policy the stage
// applies at a chunk's boundary (the rules in stage.hpp, "Mixed precision").
//
// Rules:
//  - choose() decides once, from the model configuration, the backend and the
//    layers: bf16 (or fp16 where the backend takes it, not with token ids)
//    when train.precision asks for 16-bit storage and every layer takes it;
//    else float32, where every call below returns its argument.
//  - Inside the chunk the layers see the 16-bit type; at its boundary (the
//    input, the output and their gradients) tensors are float32, so the
//    pipeline's transfers and the loss see no difference. Token ids are never
//    cast (an embedding reads them as they are and writes the 16-bit type).
//  - A slot's Buffers keep the cast copies alive until the slot's next use
//    (its backward reads what its forward cast); they are reused when the
//    shape, type and device match.
#include <vector>

#include "ringtrain/nn/layer.hpp"

namespace ringtrain {

struct ModelConfig;

class ActivationCast {
 public:
  struct Buffers {
    Tensor in16, out32, dy16, dx32;
  };
  ActivationCast() = default;  // float32: no casts
  // Tells the token-id layers which type to write.
  static ActivationCast choose(const ModelConfig& mc, Device dev, const std::vector<LayerPtr>& layers);
  DType dtype() const { return act_; }

  Tensor input(Buffers& b, const Tensor& x, const Layer& first) const {
    return act_ == DType::f32 || first.takes_token_ids() ? x : cast(b.in16, x, act_);
  }
  Tensor output(Buffers& b, const Tensor& h) const { return act_ == DType::f32 ? h : cast(b.out32, h, DType::f32); }
  // fp16: dy arrives loss-scaled (executor.cpp), so the scale is applied before this rounding (GradScaler's order).
  Tensor grad_output(Buffers& b, const Tensor& dy) const { return act_ == DType::f32 ? dy : cast(b.dy16, dy, act_); }
  Tensor grad_input(Buffers& b, const Tensor& g) const { return act_ == DType::f32 ? g : cast(b.dx32, g, DType::f32); }

 private:
  Tensor cast(Tensor& buf, const Tensor& t, DType dt) const;
  DType act_ = DType::f32;
  Device dev_;
};

}  // namespace ringtrain
