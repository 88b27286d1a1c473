// Linear and Conv2d: shape checks, parameter registration and initialisation;
// the math is the backend kernel's.
#include "init.hpp"
#include "ringtrain/nn/layers.hpp"

namespace ringtrain {

// ---- WeightLayer --------------------------------------------------------------
WeightLayer::WeightLayer(std::string name, Shape weight, bool bias, DType dt, Init init)
    : Layer(std::move(name)), init_(init), dtype_(dt), wshape_(std::move(weight)), bias_(bias) {}

void WeightLayer::register_params(ParamArena& arena, int li, const std::string& prefix) {
  w_ = add_param(arena, prefix, "weight", wshape_, dtype_, true, li);
  if (bias_) b_ = add_param(arena, prefix, "bias", {wshape_[0]}, dtype_, false, li);
}

void WeightLayer::bind_weights(const BindContext& ctx) {
  w = ctx.arena.param(w_);
  dw = ctx.arena.grad(w_);
  if (bias_) {
    b = ctx.arena.param(b_);
    db = ctx.arena.grad(b_);
  }
  split_ = ctx.backend.splits_weight_grad();
}

void WeightLayer::init(const ParamArena& arena, std::uint64_t seed) {
  const double n = double(shape_numel(wshape_));
  detail::init_weight(arena, w_, init_, n / double(wshape_[0]), n / double(wshape_[1]), seed);
  if (bias_) detail::fill_param(arena, b_, 0.0);
}

// Split backward: dx now, dw/db in backward_weight (the same kernel, in halves).
Tensor WeightLayer::do_backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  if (!split_) return do_backward(dy, c, need_dx, accumulate);
  Saved& s = saved<Saved>(c);
  Tensor dx = need_dx ? run_backward(dy, s, true, false, accumulate) : Tensor();
  s.dy = dy;
  s.w_pending = true;
  s.w_accumulate = accumulate;
  return dx;
}

void WeightLayer::do_backward_weight(Ctx& c) const {
  Saved& s = saved<Saved>(c);
  if (!s.w_pending) return;
  run_backward(s.dy, s, false, true, s.w_accumulate);
  s.w_pending = false;
  s.dy = Tensor();
}

// ---- Linear -----------------------------------------------------------------
namespace {
const LinearSpec& checked(const LinearSpec& s, const std::string& name) {
  RT_CHECK(s.in_features > 0 && s.out_features > 0, "Linear '", name, "': features must be positive, got ",
           s.in_features, " -> ", s.out_features);
  return s;
}
}  // namespace

Linear::Linear(std::string name, LinearSpec spec, Init init)
    : WeightLayer(name, {checked(spec, name).out_features, spec.in_features}, spec.bias, spec.dtype, init),
      spec_(spec) {}

void Linear::bind(const BindContext& ctx) {
  bind_weights(ctx);
  spec_.math = ctx.math;
  k_ = ctx.backend.linear(spec_);
  be_ = &ctx.backend;
  arena_ = &ctx.arena;
  w16_.invalidate();
}

const Tensor& Linear::weight_for(DType dt) const {
  if (dt == w.dtype()) return w;
  RT_CHECK((dt == DType::bf16 || dt == DType::f16) && be_ && arena_, "Linear '", name_, "': no ", dtype_name(dt), " weights for ",
           dtype_name(dt), " activations");
  return w16_.of(w, dt, *be_, *arena_);
}

// Leading dimensions are rows ([N, in] or tokens [N, T, in]): the kernel sees
// [rows, in] views of the same storage.
Shape Linear::output_shape(const Shape& in) const {
  RT_CHECK(in.size() >= 2 && in.back() == spec_.in_features, "Linear '", name_, "': expects input [N, ",
           spec_.in_features, "] or [N, ..., ", spec_.in_features, "], got ", shape_str(in));
  Shape o = in;
  o.back() = spec_.out_features;
  return o;
}

double Linear::forward_flops(const Shape& in) const {
  return 2.0 * double(shape_numel(in)) * double(spec_.out_features);
}

Tensor Linear::do_forward(const Tensor& x, Ctx& c, const Call&) const {
  Saved& s = saved<Saved>(c);
  s.x = x;
  ensure(s.y, output_shape(x.shape()), x.dtype(), x.device());
  Tensor y2 = rows_of(s.y, spec_.out_features);
  k_->forward(rows_of(x, spec_.in_features), weight_for(x.dtype()), b, y2);
  return s.y;
}

// The kernels see [rows, features]: an [N, ..., in] input is a view of N·... rows.
Tensor Linear::rows_of(const Tensor& t, std::int64_t features) const {
  return t.reshape({t.numel() / features, features});
}

Tensor Linear::run_backward(const Tensor& dy, Saved& s, bool need_dx, bool weights, bool accumulate) const {
  Tensor dx, dx2, gw = weights ? dw : Tensor(), gb = weights ? db : Tensor();
  if (need_dx) {
    dx = ensure(s.dx, s.x.shape(), s.x.dtype(), s.x.device());
    dx2 = rows_of(dx, spec_.in_features);
  }
  k_->backward(rows_of(s.x, spec_.in_features), weight_for(s.x.dtype()), rows_of(s.y, spec_.out_features),
               rows_of(dy, spec_.out_features), dx2, gw, gb, accumulate);
  return dx;
}

// ---- Conv2d -----------------------------------------------------------------
namespace {
const Conv2dSpec& checked(const Conv2dSpec& s, const std::string& name) {
  RT_CHECK(s.in_channels > 0 && s.out_channels > 0 && s.kernel_h > 0 && s.kernel_w > 0 && s.stride_h > 0 &&
               s.stride_w > 0 && s.pad_h >= 0 && s.pad_w >= 0 && s.dilation_h > 0 && s.dilation_w > 0,
           "Conv2d '", name, "': channels, kernel, stride and dilation must be positive and padding >= 0");
  const auto& p = s.pool;
  if (s.fuse_pool)
    RT_CHECK(p.kernel_h > 0 && p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0 && p.pad_h >= 0 && p.pad_w >= 0 &&
                 2 * p.pad_h <= p.kernel_h && 2 * p.pad_w <= p.kernel_w,
             "Conv2d '", name,
             "': fused pooling needs a positive kernel and stride and padding at most half the kernel");
  return s;
}
}  // namespace

Conv2d::Conv2d(std::string name, Conv2dSpec spec, Init init)
    : WeightLayer(name, {checked(spec, name).out_channels, spec.in_channels, spec.kernel_h, spec.kernel_w},
                  spec.bias, spec.dtype, init),
      spec_(spec) {}

const char* Conv2d::type() const {
  if (spec_.fuse_pool) {
    const bool mx = spec_.pool.kind == PoolKind::max;
    if (spec_.fuse_relu) return mx ? "Conv2d+ReLU+MaxPool2d" : "Conv2d+ReLU+AvgPool2d";
    return mx ? "Conv2d+MaxPool2d" : "Conv2d+AvgPool2d";
  }
  return spec_.fuse_relu ? "Conv2d+ReLU" : "Conv2d";
}

void Conv2d::bind(const BindContext& ctx) {
  bind_weights(ctx);
  RT_CHECK(!spec_.fuse_pool || ctx.backend.conv_fuses_pool(), "Conv2d '", name_, "': the ", ctx.backend.name(),
           " backend cannot fuse pooling into a convolution; use a separate Pool2d layer");
  spec_.math = ctx.math;
  k_ = ctx.backend.conv2d(spec_);
  be_ = &ctx.backend;
  arena_ = &ctx.arena;
  w16_.invalidate();
}

const Tensor& Conv2d::weight_for(DType dt) const {
  if (dt == w.dtype()) return w;
  RT_CHECK((dt == DType::bf16 || dt == DType::f16) && be_ && arena_, "Conv2d '", name_, "': no ", dtype_name(dt), " weights for ",
           dtype_name(dt), " activations");
  return w16_.of(w, dt, *be_, *arena_);
}

Shape Conv2d::output_shape(const Shape& in) const {
  Shape o = conv_shape(in);
  if (!spec_.fuse_pool) return o;
  const Shape p = pool2d_output(o, spec_.pool);
  RT_CHECK(p[2] > 0 && p[3] > 0, "Conv2d '", name_, "': its output ", shape_str(o),
           " is smaller than the fused pooling");
  return p;
}

Shape Conv2d::conv_shape(const Shape& in) const {
  const auto& s = spec_;
  RT_CHECK(in.size() == 4 && in[1] == s.in_channels, "Conv2d '", name_, "': expects input [N, ", s.in_channels,
           ", H, W], got ", shape_str(in));
  std::int64_t oh = (in[2] + 2 * s.pad_h - s.dilation_h * (s.kernel_h - 1) - 1) / s.stride_h + 1;
  std::int64_t ow = (in[3] + 2 * s.pad_w - s.dilation_w * (s.kernel_w - 1) - 1) / s.stride_w + 1;
  RT_CHECK(oh > 0 && ow > 0, "Conv2d '", name_, "': input ", shape_str(in), " is smaller than the dilated kernel");
  return {in[0], s.out_channels, oh, ow};
}

double Conv2d::forward_flops(const Shape& in) const {
  Shape o = conv_shape(in);
  return 2.0 * double(shape_numel(o)) * double(spec_.in_channels * spec_.kernel_h * spec_.kernel_w);
}

// Activations keep the input's type (bfloat16 storage: a bf16 weight copy, float32 gradients).
Tensor Conv2d::do_forward(const Tensor& x, Ctx& c, const Call&) const {
  Saved& s = saved<Saved>(c);
  s.x = x;
  ensure(s.y, output_shape(x.shape()), x.dtype(), x.device());
  k_->forward(x, weight_for(x.dtype()), b, s.y, state_in(s.ks, *k_));
  return s.y;
}

Tensor Conv2d::run_backward(const Tensor& dy, Saved& s, bool need_dx, bool weights, bool accumulate) const {
  Tensor dx, gw = weights ? dw : Tensor(), gb = weights ? db : Tensor();
  if (need_dx) dx = ensure(s.dx, s.x.shape(), s.x.dtype(), s.x.device());
  k_->backward(s.x, weight_for(s.x.dtype()), s.y, dy, dx, gw, gb, accumulate, state_in(s.ks, *k_));
  return dx;
}

}  // namespace ringtrain
