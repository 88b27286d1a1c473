#include <cmath>

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
  be_ = &ctx.backend;
  k_batch_.reset();
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

Tensor BatchNorm2d::do_forward(const Tensor& x, Ctx& c, const Call& call) const {
  const bool train = call.train();
  if (train)
    RT_CHECK(x.numel() / spec_.channels > 1, "BatchNorm2d '", name_,
             "': train mode needs more than one value per channel, got input ", shape_str(x.shape()));
  Saved& s = saved<Saved>(c);
  s.x = x;
  ensure(s.y, x.shape(), x.dtype(), x.device());  // bfloat16 data keeps its type; statistics stay float32
  // A recomputed forward normalises as the first did, with the same kernel,
  // and leaves the running (or deferred) statistics as they are.
  const bool replay = train && call.replay();
  if (train && deferred_) {
    if (replay) run_batch_kernel(x, s);
    else accumulate_batch_stats(x, s);
    return s.y;
  }
  s.k = k_.get();
  if (replay) {
    ensure(saved_mean_, running_mean.shape(), running_mean.dtype(), running_mean.device()).copy_from(running_mean);
    ensure(saved_var_, running_var.shape(), running_var.dtype(), running_var.device()).copy_from(running_var);
  }
  k_->forward(x, gamma, beta, running_mean, running_var, train, s.y, state_in(s.ks, *k_));
  if (replay) {
    running_mean.copy_from(saved_mean_);
    running_var.copy_from(saved_var_);
  }
  return s.y;
}

void BatchNorm2d::set_deferred_stats(bool on) {
  if (!on) {
    deferred_.reset();
    return;
  }
  if (!deferred_) deferred_ = std::make_shared<DeferredStats>();
}

// The forward's normalisation is the usual train-mode one; the momentum-1
// kernel makes its "running" outputs the batch's own mean and unbiased variance
// ((1 - 1) * r + 1 * batch), which are merged into the record here.
void BatchNorm2d::run_batch_kernel(const Tensor& x, Saved& st) const {
  RT_CHECK(be_, "BatchNorm2d '", name_, "': forward before bind");
  if (!k_batch_) {
    BatchNormSpec s = spec_;
    s.momentum = 1.0;
    k_batch_ = be_->batchnorm(s);
    batch_mean_ = Tensor::zeros({spec_.channels}, spec_.dtype, x.device());
    batch_var_ = Tensor::zeros({spec_.channels}, spec_.dtype, x.device());
  }
  // Both kernels are the backend's of one type: their states are alike.
  st.k = k_batch_.get();
  k_batch_->forward(x, gamma, beta, batch_mean_, batch_var_, true, st.y, state_in(st.ks, *k_batch_));
}

void BatchNorm2d::accumulate_batch_stats(const Tensor& x, Saved& st) const {
  run_batch_kernel(x, st);
  const Tensor bm = batch_mean_.device().is_cpu() ? batch_mean_ : batch_mean_.to(Device::cpu());
  const Tensor bv = batch_var_.device().is_cpu() ? batch_var_ : batch_var_.to(Device::cpu());
  RT_CHECK(bm.dtype() == DType::f32, "BatchNorm2d '", name_, "': deferred statistics need float32, got ",
           dtype_name(bm.dtype()));
  DeferredStats& d = *deferred_;
  const auto C = static_cast<std::size_t>(spec_.channels);
  if (d.mean.size() != C) {
    d.mean.assign(C, 0.0);
    d.m2.assign(C, 0.0);
  }
  const double nb = static_cast<double>(x.numel() / spec_.channels), na = d.count, n = na + nb;
  const float* pm = bm.data<float>();
  const float* pv = bv.data<float>();
  for (std::size_t c = 0; c < C; ++c) {
    const double delta = double(pm[c]) - d.mean[c];
    d.mean[c] += delta * nb / n;
    d.m2[c] += double(pv[c]) * (nb - 1) + delta * delta * na * nb / n;
  }
  d.count = n;
}

void BatchNorm2d::commit_deferred_stats() {
  if (!deferred_ || deferred_->count == 0) return;
  DeferredStats& d = *deferred_;
  Tensor rm = running_mean.device().is_cpu() ? running_mean : running_mean.to(Device::cpu());
  Tensor rv = running_var.device().is_cpu() ? running_var : running_var.to(Device::cpu());
  float* pm = rm.data<float>();
  float* pv = rv.data<float>();
  const double m = spec_.momentum;
  for (std::size_t c = 0; c < d.mean.size(); ++c) {
    pm[c] = static_cast<float>((1 - m) * pm[c] + m * d.mean[c]);
    pv[c] = static_cast<float>((1 - m) * pv[c] + m * d.m2[c] / (d.count - 1));
  }
  if (!running_mean.device().is_cpu()) {
    running_mean.copy_from(rm);
    running_var.copy_from(rv);
  }
  d = DeferredStats{};
}

Tensor BatchNorm2d::do_backward(const Tensor& dy, Ctx& c, bool, bool accumulate) const {
  // dx is always computed: BN is never the first layer of a model we build,
  // and the kernel produces dx together with dgamma/dbeta.
  Saved& s = saved<Saved>(c);
  Tensor dx = ensure(s.dx, s.x.shape(), s.x.dtype(), s.x.device());
  Tensor dg = dgamma, dbt = dbeta;
  s.k->backward(s.x, gamma, dy, dx, dg, dbt, accumulate, state_in(s.ks, *s.k));  // the kernel that ran the forward
  return dx;
}

}  // namespace ringtrain
