// Parameter-free layers: activations, pooling, dropout, flatten.
#include <functional>

#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/rng.hpp"

namespace ringtrain {
namespace {
float widen(float v) { return v; }
float widen(bfloat16 v) { return to_f32(v); }
void put(float* p, float v) { *p = v; }
void put(bfloat16* p, float v) { *p = to_bf16(v); }
}  // namespace

// ---- Activation -------------------------------------------------------------
void Activation::bind(const BindContext& ctx) { k_ = ctx.backend.eltwise(op_, DType::f32); }

Tensor Activation::do_forward(const Tensor& x, Ctx& c, const Call&) const {
  Saved& s = saved<Saved>(c);
  s.x = x;
  ensure(s.y, x.shape(), x.dtype(), x.device());
  k_->forward(x, s.y);
  return s.y;
}

Tensor Activation::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool) const {
  if (!need_dx) return {};
  Saved& s = saved<Saved>(c);
  ensure(s.dx, s.x.shape(), s.x.dtype(), s.x.device());
  k_->backward(s.x, s.y, dy, s.dx);
  return s.dx;
}

// ---- Pool2d -----------------------------------------------------------------
Shape pool2d_output(const Shape& in, const Pool2dSpec& s) {
  return {in[0], in[1], (in[2] + 2 * s.pad_h - s.kernel_h) / s.stride_h + 1,
          (in[3] + 2 * s.pad_w - s.kernel_w) / s.stride_w + 1};
}

Pool2d::Pool2d(std::string name, Pool2dSpec spec, bool global_avg)
    : Layer(std::move(name)), spec_(spec), global_(global_avg) {
  if (global_) spec_.kind = PoolKind::avg;
  else
    RT_CHECK(spec_.kernel_h > 0 && spec_.kernel_w > 0 && spec_.stride_h > 0 && spec_.stride_w > 0 &&
                 spec_.pad_h >= 0 && spec_.pad_w >= 0 && 2 * spec_.pad_h <= spec_.kernel_h &&
                 2 * spec_.pad_w <= spec_.kernel_w,
             "Pool2d '", name_, "': kernel and stride must be positive and padding at most half the kernel");
}

const char* Pool2d::type() const {
  if (global_) return "GlobalAvgPool";
  return spec_.kind == PoolKind::max ? "MaxPool2d" : "AvgPool2d";
}

void Pool2d::bind(const BindContext& ctx) {
  be_ = &ctx.backend;
  if (!global_) k_ = ctx.backend.pool2d(spec_);
  global_k_.clear();
}

Shape Pool2d::output_shape(const Shape& in) const {
  RT_CHECK(in.size() == 4 && in[2] > 0 && in[3] > 0, type(), " '", name_, "': expects input [N, C, H, W], got ",
           shape_str(in));
  if (global_) return {in[0], in[1], 1, 1};
  const Shape o = pool2d_output(in, spec_);
  RT_CHECK(o[2] > 0 && o[3] > 0, type(), " '", name_, "': input ", shape_str(in), " is smaller than the kernel");
  return o;
}

Pool2dKernel& Pool2d::kernel_for(const Shape& in) const {
  if (!global_) return *k_;
  auto& k = global_k_[{in[2], in[3]}];
  if (!k) {
    Pool2dSpec s = spec_;
    s.kernel_h = s.stride_h = in[2];
    s.kernel_w = s.stride_w = in[3];
    s.pad_h = s.pad_w = 0;
    k = be_->pool2d(s);
  }
  return *k;
}

Tensor Pool2d::do_forward(const Tensor& x, Ctx& c, const Call& call) const {
  Saved& s = saved<Saved>(c);
  Pool2dKernel& k = kernel_for(x.shape());
  if (s.k != &k) s.ks.reset();  // another kernel's state
  s.k = &k;
  s.x = x;
  ensure(s.y, output_shape(x.shape()), x.dtype(), x.device());
  k.forward(x, s.y, call.train(), state_in(s.ks, k));
  return s.y;
}

Tensor Pool2d::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool) const {
  if (!need_dx) return {};
  Saved& s = saved<Saved>(c);
  ensure(s.dx, s.x.shape(), s.x.dtype(), s.x.device());
  s.k->backward(s.x, s.y, dy, s.dx, state_in(s.ks, *s.k));
  return s.dx;
}

// ---- Dropout ----------------------------------------------------------------
Dropout::Dropout(std::string name, double p) : Layer(std::move(name)), p_(p) {
  RT_CHECK(p >= 0 && p < 1, "Dropout '", name_, "': probability must be in [0, 1), got ", p);
}

void Dropout::bind(const BindContext& ctx) {
  be_ = &ctx.backend;
  seed_ = ctx.seed;
  stream_ = mix64(std::hash<std::string>{}(name_)) << 20;  // each layer its own streams
}

Tensor Dropout::do_forward(const Tensor& x, Ctx& c, const Call& call) const {
  Saved& s = saved<Saved>(c);
  s.identity = !call.train() || p_ == 0;
  if (s.identity) return x;
  Tensor& mask_ = s.mask;
  Tensor& y_ = s.y;
  ensure(mask_, x.shape(), DType::u8, x.device());
  ensure(y_, x.shape(), x.dtype(), x.device());
  // A sample's elements are numbered from the step's first sample (see the header).
  const std::uint64_t stream = stream_ + (call.position ? call.position->step : calls_++);
  const std::int64_t per_sample = x.dim(0) > 0 ? x.numel() / x.dim(0) : 0;
  const std::int64_t first_sample = call.position ? call.position->first_sample : 0;
  if (cp_) return forward_context(x, s, stream, first_sample);  // context_layers.cpp
  if (parts_ == 1 && token_parts_ == 1) {
    be_->dropout_forward(x, p_, seed_, stream, static_cast<std::uint64_t>(first_sample * per_sample), mask_, y_);
    return y_;
  }
  if (token_parts_ > 1) {  // each sample's tokens are one run of the whole sample's elements
    const std::int64_t whole = per_sample * token_parts_;
    for (std::int64_t n = 0; n < x.dim(0); ++n) {
      Tensor yn = y_.flat_view(n * per_sample, per_sample), mn = mask_.flat_view(n * per_sample, per_sample);
      be_->dropout_forward(x.flat_view(n * per_sample, per_sample), p_, seed_, stream,
                           static_cast<std::uint64_t>((first_sample + n) * whole + index_ * per_sample), mn, yn);
    }
    return y_;
  }
  RT_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, "Dropout '", name_,
           "': a feature-sharded dropout takes float32 or bfloat16 tensors, got ", dtype_name(x.dtype()));
  // Feature shard `index_` of `parts_`: number elements as in the whole activation.
  // Computed on the host (a device tensor makes the round trip).
  const bool host = x.device().is_cpu();
  const Tensor xh = host ? x : x.to(Device::cpu());
  Tensor yh = host ? y_ : Tensor::empty(x.shape(), x.dtype()), mh = host ? mask_ : Tensor::empty(x.shape(), DType::u8);
  const std::int64_t d = x.shape().back(), whole = d * parts_;
  const std::int64_t base = first_sample * per_sample * parts_;
  const float pf = static_cast<float>(p_), scale = static_cast<float>(1.0 / (1.0 - p_));  // as the backends
  std::uint8_t* pm = mh.data<std::uint8_t>();
  // bfloat16: the same keep decisions, the scaled value rounded once (as the backend's dropout).
  auto run = [&](const auto* px, auto* py) {
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const std::int64_t global = base + (i / d) * whole + index_ * d + i % d;
      const bool keep = dropout_keep(seed_, stream, static_cast<std::uint64_t>(global), pf);
      pm[i] = keep;
      put(py + i, keep ? widen(px[i]) * scale : 0.f);
    }
  };
  if (x.dtype() == DType::bf16) run(xh.data<bfloat16>(), yh.data<bfloat16>());
  else run(xh.data<float>(), yh.data<float>());
  if (!host) {
    y_.copy_from(yh);
    mask_.copy_from(mh);
  }
  return y_;
}

Tensor Dropout::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool) const {
  if (!need_dx) return {};
  Saved& s = saved<Saved>(c);
  if (s.identity) return dy;
  ensure(s.dx, dy.shape(), dy.dtype(), dy.device());
  be_->dropout_backward(dy, s.mask, p_, s.dx);
  return s.dx;
}

// ---- Flatten ----------------------------------------------------------------
Shape Flatten::output_shape(const Shape& in) const {
  RT_CHECK(in.size() >= 2, "Flatten '", name_, "': expects at least [N, ...], got ", shape_str(in));
  std::int64_t rest = 1;
  for (std::size_t i = 1; i < in.size(); ++i) rest *= in[i];
  return {in[0], rest};
}

Tensor Flatten::do_forward(const Tensor& x, Ctx&, const Call&) const { return x.reshape(output_shape(x.shape())); }

Tensor Flatten::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool) const {
  if (!need_dx) return {};
  return dy.reshape(c.in_shape);
}

}  // namespace ringtrain
