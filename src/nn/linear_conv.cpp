// Linear and Conv2d: shape checks, parameter registration and initialisation;
// the math is the backend kernel's.
#include "init.hpp"
#include "ringtrain/nn/layers.hpp"

namespace ringtrain {

// ---- Linear -----------------------------------------------------------------
Linear::Linear(std::string name, LinearSpec spec, Init init) : Layer(std::move(name)), spec_(spec), init_(init) {
  RT_CHECK(spec_.in_features > 0 && spec_.out_features > 0, "Linear '", name_, "': features must be positive, got ",
           spec_.in_features, " -> ", spec_.out_features);
}

void Linear::register_params(ParamArena& arena, int li, const std::string& prefix) {
  w_ = add_param(arena, prefix, "weight", {spec_.out_features, spec_.in_features}, spec_.dtype, true, li);
  if (spec_.bias) b_ = add_param(arena, prefix, "bias", {spec_.out_features}, spec_.dtype, false, li);
}

void Linear::bind(const BindContext& ctx) {
  w = ctx.arena.param(w_);
  dw = ctx.arena.grad(w_);
  if (spec_.bias) {
    b = ctx.arena.param(b_);
    db = ctx.arena.grad(b_);
  }
  spec_.math = ctx.math;
  split_ = ctx.backend.splits_weight_grad();
  k_ = ctx.backend.linear(spec_);
}

void Linear::init(const ParamArena& arena, std::uint64_t seed) {
  detail::init_weight(arena, w_, init_, double(spec_.in_features), double(spec_.out_features), seed);
  if (spec_.bias) detail::fill_param(arena, b_, 0.0);
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

Tensor Linear::do_forward(const Tensor& x, Mode) {
  x_ = x;
  ensure(y_, output_shape(x.shape()), spec_.dtype, x.device());
  Tensor y2 = rows_of(y_, spec_.out_features);
  k_->forward(rows_of(x, spec_.in_features), w, b, y2);
  return y_;
}

// The kernels see [rows, features]: an [N, ..., in] input is a view of N·... rows.
Tensor Linear::rows_of(const Tensor& t, std::int64_t features) const {
  return t.reshape({x_.numel() / spec_.in_features, features});
}

// Both halves when dw/db are given, dx alone when they are undefined.
Tensor Linear::backward_kernel(const Tensor& dy, bool need_dx, Tensor dw_, Tensor db_, bool accumulate) {
  Tensor dx, dx2;
  if (need_dx) {
    dx = ensure(dx_, x_.shape(), spec_.dtype, x_.device());
    dx2 = rows_of(dx, spec_.in_features);
  }
  k_->backward(rows_of(x_, spec_.in_features), w, rows_of(y_, spec_.out_features), rows_of(dy, spec_.out_features),
               dx2, dw_, db_, accumulate);
  return dx;
}

Tensor Linear::do_backward(const Tensor& dy, bool need_dx, bool accumulate) {
  return backward_kernel(dy, need_dx, dw, db, accumulate);
}

// Split backward: dx now, dw/db in backward_weight (same kernel call, halves).
Tensor Linear::do_backward_input(const Tensor& dy, bool need_dx, bool accumulate) {
  if (!split_) return do_backward(dy, need_dx, accumulate);
  Tensor dx = need_dx ? backward_kernel(dy, true, Tensor(), Tensor(), accumulate) : Tensor();
  dy_ = dy;
  w_pending_ = true;
  w_accumulate_ = accumulate;
  return dx;
}

void Linear::do_backward_weight() {
  if (!w_pending_) return;
  backward_kernel(dy_, false, dw, db, w_accumulate_);
  w_pending_ = false;
  dy_ = Tensor();
}

// ---- Conv2d -----------------------------------------------------------------
Conv2d::Conv2d(std::string name, Conv2dSpec spec, Init init) : Layer(std::move(name)), spec_(spec), init_(init) {
  const auto& s = spec_;
  RT_CHECK(s.in_channels > 0 && s.out_channels > 0 && s.kernel_h > 0 && s.kernel_w > 0 && s.stride_h > 0 &&
               s.stride_w > 0 && s.pad_h >= 0 && s.pad_w >= 0 && s.dilation_h > 0 && s.dilation_w > 0,
           "Conv2d '", name_, "': channels, kernel, stride and dilation must be positive and padding >= 0");
  const auto& p = spec_.pool;
  if (s.fuse_pool)
    RT_CHECK(p.kernel_h > 0 && p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0 && p.pad_h >= 0 && p.pad_w >= 0 &&
                 2 * p.pad_h <= p.kernel_h && 2 * p.pad_w <= p.kernel_w,
             "Conv2d '", name_, "': fused pooling needs a positive kernel and stride and padding at most half the kernel");
}

const char* Conv2d::type() const {
  if (spec_.fuse_pool) {
    const bool mx = spec_.pool.kind == PoolKind::max;
    if (spec_.fuse_relu) return mx ? "Conv2d+ReLU+MaxPool2d" : "Conv2d+ReLU+AvgPool2d";
    return mx ? "Conv2d+MaxPool2d" : "Conv2d+AvgPool2d";
  }
  return spec_.fuse_relu ? "Conv2d+ReLU" : "Conv2d";
}

void Conv2d::register_params(ParamArena& arena, int li, const std::string& prefix) {
  w_ = add_param(arena, prefix, "weight", {spec_.out_channels, spec_.in_channels, spec_.kernel_h, spec_.kernel_w},
                 spec_.dtype, true, li);
  if (spec_.bias) b_ = add_param(arena, prefix, "bias", {spec_.out_channels}, spec_.dtype, false, li);
}

void Conv2d::bind(const BindContext& ctx) {
  w = ctx.arena.param(w_);
  dw = ctx.arena.grad(w_);
  if (spec_.bias) {
    b = ctx.arena.param(b_);
    db = ctx.arena.grad(b_);
  }
  RT_CHECK(!spec_.fuse_pool || ctx.backend.conv_fuses_pool(), "Conv2d '", name_, "': the ", ctx.backend.name(),
           " backend cannot fuse pooling into a convolution; use a separate Pool2d layer");
  spec_.math = ctx.math;
  split_ = ctx.backend.splits_weight_grad();
  k_ = ctx.backend.conv2d(spec_);
}

void Conv2d::init(const ParamArena& arena, std::uint64_t seed) {
  double rf = double(spec_.kernel_h * spec_.kernel_w);
  detail::init_weight(arena, w_, init_, rf * double(spec_.in_channels), rf * double(spec_.out_channels), seed);
  if (spec_.bias) detail::fill_param(arena, b_, 0.0);
}

Shape Conv2d::output_shape(const Shape& in) const {
  Shape o = conv_shape(in);
  if (!spec_.fuse_pool) return o;
  const auto& p = spec_.pool;
  std::int64_t ph = (o[2] + 2 * p.pad_h - p.kernel_h) / p.stride_h + 1;
  std::int64_t pw = (o[3] + 2 * p.pad_w - p.kernel_w) / p.stride_w + 1;
  RT_CHECK(ph > 0 && pw > 0, "Conv2d '", name_, "': its output ", shape_str(o), " is smaller than the fused pooling");
  return {o[0], o[1], ph, pw};
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

Tensor Conv2d::do_forward(const Tensor& x, Mode) {
  x_ = x;
  ensure(y_, output_shape(x.shape()), spec_.dtype, x.device());
  k_->forward(x, w, b, y_);
  return y_;
}

Tensor Conv2d::do_backward(const Tensor& dy, bool need_dx, bool accumulate) {
  Tensor dx;
  if (need_dx) dx = ensure(dx_, x_.shape(), spec_.dtype, x_.device());
  k_->backward(x_, w, y_, dy, dx, dw, db, accumulate);
  return dx;
}

// Split backward: dx now, dw/db in backward_weight (same kernel call, halves).
Tensor Conv2d::do_backward_input(const Tensor& dy, bool need_dx, bool accumulate) {
  if (!split_) return do_backward(dy, need_dx, accumulate);
  Tensor dx, none_w, none_b;
  if (need_dx) {
    dx = ensure(dx_, x_.shape(), spec_.dtype, x_.device());
    k_->backward(x_, w, y_, dy, dx, none_w, none_b, accumulate);
  }
  dy_ = dy;
  w_pending_ = true;
  w_accumulate_ = accumulate;
  return dx;
}

void Conv2d::do_backward_weight() {
  if (!w_pending_) return;
  Tensor none;
  k_->backward(x_, w, y_, dy_, none, dw, db, w_accumulate_);
  w_pending_ = false;
  dy_ = Tensor();
}

}  // namespace ringtrain
