#pragma once
// Activation recomputation as layer wrappers (train.recompute, parallel/stage.hpp).
//  - Recomputed (block): a train-mode forward keeps only the wrapped layer's
//    input and its Call; the layer's context (its activations, gradient
//    buffers, kernel state) is dropped right after the forward. The backward
//    reruns the forward from the kept input into a fresh context, with the
//    call marked replay (the same dropout masks, no BatchNorm statistics
//    updated), runs the backward and drops the context again (after
//    backward_weight where the layer defers its weight gradients). Gives
//    bitwise the gradients of the unwrapped layer; a row-parallel layer's
//    replay all-reduces again. Eval-mode forwards keep their context.
//  - Attention (`attention`): MultiHeadSelfAttention::set_recompute_core on
//    every attention layer under a root; the probabilities are dropped and
//    recomputed inside the attention's backward.
#include <memory>

#include "ringtrain/nn/layer.hpp"

namespace ringtrain {

class Recomputed final : public Layer {
 public:
  explicit Recomputed(LayerPtr inner);
  const char* type() const override { return inner_->type(); }
  Layer& inner() { return *inner_; }
  // Parameters are the inner layer's (registered through it).
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override { inner_->bind(ctx); }
  void init(const ParamArena& arena, std::uint64_t seed) override { inner_->init(arena, seed); }
  Shape output_shape(const Shape& in) const override { return inner_->output_shape(in); }
  std::vector<NamedBuffer> buffers() const override { return inner_->buffers(); }
  double forward_flops(const Shape& in) const override { return inner_->forward_flops(in); }
  bool splits_backward() const override { return inner_->splits_backward(); }
  void for_each_child(const std::function<void(Layer&)>& f) override { f(*inner_); }
  bool takes_bf16() const override { return inner_->takes_bf16(); }
  bool takes_token_ids() const override { return inner_->takes_token_ids(); }
  std::shared_ptr<const Loss> output_loss() const override { return inner_->output_loss(); }
  void set_output_dtype(DType dt) override { inner_->set_output_dtype(dt); }
  CtxPtr make_ctx() const override { return ctx_of<Saved>(); }

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;
  Tensor do_backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;
  void do_backward_weight(Ctx& c) const override;

 private:
  struct Saved {
    Tensor x;     // the input of a train forward
    Call call;    // and how it ran
    CtxPtr inner;  // the inner layer's context, only while a pass needs it
  };
  Ctx& replayed(Saved& s) const;  // the inner context, rebuilt by rerunning the forward when dropped
  LayerPtr inner_;
};

// A Recomputed around l (the same layer when it is one already).
LayerPtr recomputed(LayerPtr l);
// Sets MultiHeadSelfAttention::set_recompute_core(on) on every attention layer under root (itself included).
void recompute_attention(Layer& root, bool on);

}  // namespace ringtrain
