#include "ringtrain/nn/layer.hpp"

namespace ringtrain {

Tensor Layer::forward(const Tensor& x, Ctx& c, const Call& call) const {
  RT_CHECK(x.defined(), "layer '", name_, "' (", type(), "): forward got an undefined tensor");
  output_shape(x.shape());  // throws naming this layer when the shape does not fit
  c.in_shape = x.shape();
  c.mode = call.mode;
  c.has_forward = true;
  return do_forward(x, c, call);
}

Tensor Layer::backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  RT_CHECK(c.has_forward, "layer '", name_, "' (", type(), "): backward called before forward");
  RT_CHECK(dy.defined() && dy.shape() == output_shape(c.in_shape), "layer '", name_, "' (", type(),
           "): gradient has shape ", dy.defined() ? shape_str(dy.shape()) : std::string("(undefined)"),
           ", the forward output had ", shape_str(output_shape(c.in_shape)));
  return do_backward_input(dy, c, need_dx, accumulate);
}

Tensor Layer::backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  RT_CHECK(c.has_forward, "layer '", name_, "' (", type(), "): backward called before forward");
  RT_CHECK(dy.defined(), "layer '", name_, "' (", type(), "): backward got an undefined gradient");
  Shape expect = output_shape(c.in_shape);
  RT_CHECK(dy.shape() == expect, "layer '", name_, "' (", type(), "): gradient has shape ", shape_str(dy.shape()),
           ", the forward output had ", shape_str(expect));
  return do_backward(dy, c, need_dx, accumulate);
}

Ctx& Layer::own_ctx() {
  if (!own_) own_ = make_ctx();
  return *own_;
}

std::size_t Layer::add_param(ParamArena& arena, const std::string& prefix, const std::string& pname, Shape shape,
                             DType dt, bool decay, int layer_index) {
  std::size_t i = arena.add(prefix + name_ + "." + pname, std::move(shape), dt, decay, layer_index);
  params_.push_back(i);
  return i;
}

Tensor& Layer::ensure(Tensor& slot, const Shape& shape, DType dt, Device dev) {
  if (!slot.defined() || slot.shape() != shape || slot.dtype() != dt || slot.device() != dev)
    slot = Tensor::empty(shape, dt, dev);
  return slot;
}

const Tensor& WeightCopy::of(const Tensor& w, DType dt, Backend& be, const ParamArena& arena) const {
  if (!valid_ || version_ != arena.version()) {
    if (!copy_.defined() || copy_.shape() != w.shape() || copy_.dtype() != dt || copy_.device() != w.device())
      copy_ = Tensor::empty(w.shape(), dt, w.device());
    be.cast(w, copy_);
    version_ = arena.version();
    valid_ = true;
  }
  return copy_;
}

}  // namespace ringtrain
