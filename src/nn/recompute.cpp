// Block recomputation (nn/recompute.hpp): the wrapped layer's context lives
// only while a pass over it runs.
#include "ringtrain/nn/recompute.hpp"

#include "ringtrain/nn/transformer.hpp"

namespace ringtrain {

Recomputed::Recomputed(LayerPtr inner) : Layer(inner ? inner->name() : std::string()), inner_(std::move(inner)) {
  RT_CHECK(inner_, "Recomputed: needs a layer");
  params_ = inner_->params();  // when wrapped after registration
}

void Recomputed::register_params(ParamArena& arena, int layer_index, const std::string& prefix) {
  inner_->register_params(arena, layer_index, prefix);
  params_ = inner_->params();
}

Tensor Recomputed::do_forward(const Tensor& x, Ctx& c, const Call& call) const {
  Saved& s = saved<Saved>(c);
  s.call = call;
  if (!call.train()) {  // nothing to recompute: no backward follows a forward that is only evaluated
    s.x = Tensor();
    if (!s.inner) s.inner = inner_->make_ctx();
    return inner_->forward(x, *s.inner, call);
  }
  // A replay must draw what the forward drew: a position-less call is given the origin.
  if (!s.call.position) s.call.position = SamplePosition{};
  s.x = x;
  s.inner = inner_->make_ctx();
  Tensor y = inner_->forward(x, *s.inner, s.call);
  s.inner.reset();  // y and the kept input stay alive (the caller holds y)
  return y;
}

Ctx& Recomputed::replayed(Saved& s) const {
  if (s.inner) return *s.inner;  // eval, or a weight half still owed
  RT_CHECK(s.x.defined(), "layer '", name_, "' (recomputed ", type(), "): backward without a train forward");
  Call r = s.call;
  r.position->replay = true;
  s.inner = inner_->make_ctx();
  inner_->forward(s.x, *s.inner, r);
  s.x = Tensor();  // the inner context holds it now, until dropped
  return *s.inner;
}

Tensor Recomputed::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  Saved& s = saved<Saved>(c);
  Tensor g = inner_->backward(dy, replayed(s), need_dx, accumulate);
  if (s.call.train()) s.inner.reset();  // g, its input gradient, stays alive
  return g;
}

Tensor Recomputed::do_backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  Saved& s = saved<Saved>(c);
  Tensor g = inner_->backward_input(dy, replayed(s), need_dx, accumulate);
  // A layer that defers its weight gradient keeps its activations until backward_weight.
  if (s.call.train() && !inner_->splits_backward()) s.inner.reset();
  return g;
}

void Recomputed::do_backward_weight(Ctx& c) const {
  Saved& s = saved<Saved>(c);
  if (!s.inner) return;  // nothing deferred
  inner_->backward_weight(*s.inner);
  if (s.call.train()) s.inner.reset();
}

LayerPtr recomputed(LayerPtr l) {
  if (dynamic_cast<Recomputed*>(l.get())) return l;
  return std::make_unique<Recomputed>(std::move(l));
}

void recompute_attention(Layer& root, bool on) {
  if (auto* a = dynamic_cast<MultiHeadSelfAttention*>(&root)) a->set_recompute_core(on);
  root.for_each_child([&](Layer& c) { recompute_attention(c, on); });
}

}  // namespace ringtrain
