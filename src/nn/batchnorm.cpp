#include "init.hpp"
#include "ringtrain/nn/layers.hpp"

namespace ringtrain {

BatchNorm2d::BatchNorm2d(std::string name, BatchNormSpec spec) : Layer(std::move(name)), spec_(spec) {
  RT_CHECK(spec_.channels > 0 && spec_.eps > 0 && spec_.momentum >= 0 && spec_.momentum <= 1, "BatchNorm2d '", name_,
           "': needs channels > 0, eps > 0 and momentum in [0, 1]");
}

void BatchNorm2d::register_params(ParamArena& arena, int li, const std::string& prefix) {
  prefix_ = prefix;
  g_ = add_param(arena, prefix, "weight", {spec_.channels}, spec_.dtype, false, li);
  b_ = add_param(arena, prefix, "bias", {spec_.channels}, spec_.dtype, false, li);
}

void BatchNorm2d::bind(const BindContext& ctx) {
  gamma = ctx.arena.param(g_);
  beta = ctx.arena.param(b_);
  dgamma = ctx.arena.grad(g_);
  dbeta = ctx.arena.grad(b_);
  running_mean = Tensor::zeros({spec_.channels}, spec_.dtype, ctx.device);
  running_var = Tensor::zeros({spec_.channels}, spec_.dtype, ctx.device);
  k_ = ctx.backend.batchnorm(spec_);
}

void BatchNorm2d::init(const ParamArena& arena, std::uint64_t) {
  detail::fill_param(arena, g_, 1.0);
  detail::fill_param(arena, b_, 0.0);
  detail::fill_tensor(running_mean, 0.0);
  detail::fill_tensor(running_var, 1.0);
}

std::vector<NamedBuffer> BatchNorm2d::buffers() const {
  return {{prefix_ + name_ + ".running_mean", running_mean, {}}, {prefix_ + name_ + ".running_var", running_var, {}}};
}

Shape BatchNorm2d::output_shape(const Shape& in) const {
  RT_CHECK(in.size() == 4 && in[1] == spec_.channels, "BatchNorm2d '", name_, "': expects input [N, ", spec_.channels,
           ", H, W], got ", shape_str(in));
  return in;
}

Tensor BatchNorm2d::do_forward(const Tensor& x, Mode mode) {
  if (mode == Mode::train)
    RT_CHECK(x.numel() / spec_.channels > 1, "BatchNorm2d '", name_,
             "': train mode needs more than one value per channel, got input ", shape_str(x.shape()));
  x_ = x;
  ensure(y_, x.shape(), spec_.dtype, x.device());
  k_->forward(x, gamma, beta, running_mean, running_var, mode == Mode::train, y_);
  return y_;
}

Tensor BatchNorm2d::do_backward(const Tensor& dy, bool, bool accumulate) {
  // dx is always computed: BN is never the first layer of a model we build,
  // and the kernel produces dx together with dgamma/dbeta.
  Tensor dx = ensure(dx_, x_.shape(), spec_.dtype, x_.device());
  k_->backward(x_, gamma, dy, dx, dgamma, dbeta, accumulate);
  return dx;
}

}  // namespace ringtrain
