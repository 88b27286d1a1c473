// Channel-split convolutions and BatchNorm (see nn/tensor_parallel_conv.hpp).
// The local math is an ordinary Conv2d / BatchNorm2d on the shard; this file
// adds the communication, the post-reduction ops and the shard bookkeeping.
#include "ringtrain/nn/tensor_parallel_conv.hpp"

#include "init.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"

namespace ringtrain {
namespace {

double receptive_field(const Conv2dSpec& s) { return double(s.kernel_h * s.kernel_w); }

Shape whole_weight(const Conv2dSpec& s) { return {s.out_channels, s.in_channels, s.kernel_h, s.kernel_w}; }

}  // namespace

// ---- ColumnParallelConv2d ----------------------------------------------------
ColumnParallelConv2d::ColumnParallelConv2d(std::string name, Conv2dSpec spec, Init init, TensorGroup g)
    : Layer(std::move(name)), spec_(spec), init_(init), g_(std::move(g)) {
  RT_CHECK(spec_.out_channels % g_.size == 0, "ColumnParallelConv2d '", name_, "': ", spec_.out_channels,
           " filters are not divisible by the tensor size ", g_.size);
  Conv2dSpec local = spec_;
  local.out_channels = spec_.out_channels / g_.size;
  local_ = std::make_unique<Conv2d>(name_, local, init_);
}

void ColumnParallelConv2d::register_params(ParamArena& arena, int li, const std::string& prefix) {
  local_->register_params(arena, li, prefix);
  params_ = local_->params();
  arena.set_shard(params_[0], make_shard(whole_weight(spec_), 0, g_.size, g_.rank));
  if (spec_.bias) arena.set_shard(params_[1], make_shard({spec_.out_channels}, 0, g_.size, g_.rank));
}

void ColumnParallelConv2d::bind(const BindContext& ctx) {
  local_->bind(ctx);
}

void ColumnParallelConv2d::init(const ParamArena& arena, std::uint64_t seed) {
  const double rf = receptive_field(spec_);
  detail::init_shard(arena, params_[0], init_, rf * double(spec_.in_channels), rf * double(spec_.out_channels), seed);
  if (spec_.bias) detail::fill_param(arena, params_[1], 0.0);
}

Tensor ColumnParallelConv2d::do_backward(const Tensor& dy, bool need_dx, bool accumulate) {
  return detail::column_parallel_backward(*local_, dy, need_dx, accumulate, g_);  // async dgrad all-reduce
}

// ---- RowParallelConv2d -------------------------------------------------------
RowParallelConv2d::RowParallelConv2d(std::string name, Conv2dSpec spec, Init init, TensorGroup g)
    : Layer(std::move(name)), spec_(spec), init_(init), g_(std::move(g)) {
  RT_CHECK(spec_.in_channels % g_.size == 0, "RowParallelConv2d '", name_, "': ", spec_.in_channels,
           " input channels are not divisible by the tensor size ", g_.size);
  Conv2dSpec local = spec_;
  local.in_channels = spec_.in_channels / g_.size;
  local.bias = local.fuse_relu = local.fuse_pool = false;  // after the reduction, here
  local_ = std::make_unique<Conv2d>(name_, local, init_);
}

void RowParallelConv2d::register_params(ParamArena& arena, int li, const std::string& prefix) {
  local_->register_params(arena, li, prefix);
  params_ = local_->params();
  arena.set_shard(params_[0], make_shard(whole_weight(spec_), 1, g_.size, g_.rank));
  if (spec_.bias) b_ = add_param(arena, prefix, "bias", {spec_.out_channels}, spec_.dtype, false, li);  // replicated
}

void RowParallelConv2d::bind(const BindContext& ctx) {
  local_->bind(ctx);
  if (spec_.bias) {
    b = ctx.arena.param(b_);
    db = ctx.arena.grad(b_);
  }
  if (spec_.fuse_pool) pool_ = ctx.backend.pool2d(spec_.pool);
}

void RowParallelConv2d::init(const ParamArena& arena, std::uint64_t seed) {
  const double rf = receptive_field(spec_);
  detail::init_shard(arena, params_[0], init_, rf * double(spec_.in_channels), rf * double(spec_.out_channels), seed);
  if (spec_.bias) detail::fill_param(arena, b_, 0.0);
}

Shape RowParallelConv2d::output_shape(const Shape& in) const {
  Shape o = local_->output_shape(in);
  if (!spec_.fuse_pool) return o;
  const auto& p = spec_.pool;  // as Pool2d
  const std::int64_t ph = (o[2] + 2 * p.pad_h - p.kernel_h) / p.stride_h + 1;
  const std::int64_t pw = (o[3] + 2 * p.pad_w - p.kernel_w) / p.stride_w + 1;
  RT_CHECK(ph > 0 && pw > 0, "RowParallelConv2d '", name_, "': its output ", shape_str(o),
           " is smaller than the fused pooling");
  return {o[0], o[1], ph, pw};
}

Tensor RowParallelConv2d::do_forward(const Tensor& x, Mode mode) {
  Tensor partial = local_->forward(x, mode);
  ensure(z_, partial.shape(), partial.dtype(), partial.device());
  z_.copy_from(partial);
  tp_all_reduce(z_, g_);  // g: sum the partial convolutions
  if (spec_.bias || spec_.fuse_relu) {
    const std::int64_t C = z_.dim(1), hw = z_.dim(2) * z_.dim(3), n = z_.dim(0);
    float* z = z_.data<float>();
    const float* bias = spec_.bias ? b.data<float>() : nullptr;
    for (std::int64_t i = 0; i < n * C; ++i) {
      const float add = bias ? bias[i % C] : 0.f;
      for (std::int64_t k = 0; k < hw; ++k) {
        const float v = z[i * hw + k] + add;
        z[i * hw + k] = spec_.fuse_relu && v < 0.f ? 0.f : v;
      }
    }
  }
  if (!spec_.fuse_pool) return z_;
  ensure(y_, output_shape(x.shape()), z_.dtype(), z_.device());
  pool_->forward(z_, y_, mode == Mode::train);
  return y_;
}

Tensor RowParallelConv2d::do_backward(const Tensor& dy, bool need_dx, bool accumulate) {
  Tensor dz = dy;
  if (spec_.fuse_pool) {
    ensure(dz_, z_.shape(), z_.dtype(), z_.device());
    pool_->backward(z_, y_, dy, dz_);
    dz = dz_;
  } else if (spec_.fuse_relu) {
    ensure(dz_, dy.shape(), dy.dtype(), dy.device());
    dz_.copy_from(dy);
    dz = dz_;
  }
  const std::int64_t C = z_.dim(1), hw = z_.dim(2) * z_.dim(3), n = z_.dim(0);
  float* d = dz.data<float>();
  if (spec_.fuse_relu) {  // z_ holds relu's output: zero where it clipped
    const float* z = z_.data<float>();
    for (std::int64_t i = 0; i < dz.numel(); ++i) d[i] = z[i] > 0.f ? d[i] : 0.f;
  }
  if (spec_.bias) {  // every tensor rank: the same db (the reduced output is replicated)
    float* g = db.data<float>();
    for (std::int64_t c = 0; c < C; ++c) {
      double s = 0;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t k = 0; k < hw; ++k) s += d[(i * C + c) * hw + k];
      g[c] = static_cast<float>(accumulate ? g[c] + s : s);
    }
  }
  return local_->backward(dz, need_dx, accumulate);  // g's backward is the identity
}

// ---- ChannelParallelBatchNorm2d ------------------------------------------------
namespace {
BatchNormSpec local_bn(BatchNormSpec s, const TensorGroup& g, const std::string& name) {
  RT_CHECK(s.channels % g.size == 0, "ChannelParallelBatchNorm2d '", name, "': ", s.channels,
           " channels are not divisible by the tensor size ", g.size);
  s.channels /= g.size;
  return s;
}
}  // namespace

ChannelParallelBatchNorm2d::ChannelParallelBatchNorm2d(std::string name, BatchNormSpec whole, TensorGroup g)
    : BatchNorm2d(name, local_bn(whole, g, name)), channels_(whole.channels), g_(std::move(g)) {}

void ChannelParallelBatchNorm2d::register_params(ParamArena& arena, int li, const std::string& prefix) {
  BatchNorm2d::register_params(arena, li, prefix);
  for (std::size_t i : params_) arena.set_shard(i, make_shard({channels_}, 0, g_.size, g_.rank));  // gamma, beta
}

std::vector<NamedBuffer> ChannelParallelBatchNorm2d::buffers() const {
  auto out = BatchNorm2d::buffers();
  for (auto& b : out) b.shard = make_shard({channels_}, 0, g_.size, g_.rank);
  return out;
}

}  // namespace ringtrain
