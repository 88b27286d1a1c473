// TokenEmbedding and the tied LmHead (nn/language.hpp).
#include <algorithm>
#include <cmath>

#include "init.hpp"
#include "ringtrain/nn/language.hpp"

namespace ringtrain {
namespace {
float store_as(float, float v) { return v; }
bfloat16 store_as(bfloat16, float v) { return to_bf16(v); }
float as_float(float v) { return v; }
float as_float(bfloat16 v) { return to_f32(v); }
}  // namespace

// ---- TokenEmbedding ---------------------------------------------------------
TokenEmbedding::TokenEmbedding(std::string name, std::int64_t vocab, std::int64_t positions, std::int64_t dim)
    : Layer(std::move(name)), vocab_(vocab), positions_(positions), dim_(dim) {
  RT_CHECK(vocab > 0 && positions > 0 && dim > 0, "TokenEmbedding '", name_, "': vocab (", vocab, "), positions (",
           positions, ") and width (", dim, ") must be positive");
}

void TokenEmbedding::register_params(ParamArena& arena, int li, const std::string& prefix) {
  w_ = add_param(arena, prefix, "weight", {vocab_, dim_}, DType::f32, true, li);
  p_ = add_param(arena, prefix, "pos_embed", {positions_, dim_}, DType::f32, false, li);
}

void TokenEmbedding::bind(const BindContext& ctx) {
  RT_CHECK(ctx.device.is_cpu(), "TokenEmbedding '", name_, "': runs on the CPU only, not ", ctx.device.str());
  weight = ctx.arena.param(w_);
  pos = ctx.arena.param(p_);
  dweight = ctx.arena.grad(w_);
  dpos = ctx.arena.grad(p_);
}

void TokenEmbedding::init(const ParamArena& arena, std::uint64_t seed) {
  detail::init_normal(arena, w_, 0.02, seed);
  detail::init_normal(arena, p_, 0.02, seed);
}

Shape TokenEmbedding::output_shape(const Shape& in) const {
  RT_CHECK(in.size() == 2 && in[1] >= 1 && in[1] <= positions_, "TokenEmbedding '", name_,
           "': expects token ids [N, T] with T <= ", positions_, " positions, got ", shape_str(in));
  return {in[0], in[1], dim_};
}

Tensor TokenEmbedding::do_forward(const Tensor& x, Mode) {
  const std::int64_t n = x.dim(0), t = x.dim(1), d = dim_;
  RT_CHECK(x.dtype() == DType::f32, "TokenEmbedding '", name_, "': token ids must be float32, got ",
           dtype_name(x.dtype()));
  ensure(y_, {n, t, d}, out_dt_, x.device());
  ids_.resize(std::size_t(n * t));
  const float* id = x.data<float>();
  for (std::int64_t i = 0; i < n * t; ++i) {
    const float v = id[i];
    RT_CHECK(v >= 0 && v < float(vocab_) && v == std::floor(v), "TokenEmbedding '", name_, "': input ", i, " = ", v,
             " is not a token id in [0, ", vocab_, ")");
    ids_[std::size_t(i)] = std::int32_t(v);
  }
  const float *w = weight.data<float>(), *p = pos.data<float>();
  auto rows = [&](auto* y) {  // float32, or the sum rounded once to bf16
    for (std::int64_t i = 0; i < n * t; ++i) {
      const float* wr = w + std::int64_t(ids_[std::size_t(i)]) * d;
      const float* pr = p + (i % t) * d;
      auto* yr = y + i * d;
      for (std::int64_t k = 0; k < d; ++k) yr[k] = store_as(yr[k], wr[k] + pr[k]);
    }
  };
  if (out_dt_ == DType::bf16) rows(y_.data<bfloat16>());
  else rows(y_.data<float>());
  return y_;
}

Tensor TokenEmbedding::do_backward(const Tensor& dy, bool, bool accumulate) {
  const std::int64_t t = in_shape_[1], rows = in_shape_[0] * t, d = dim_;
  float *dw = dweight.data<float>(), *dp = dpos.data<float>();
  if (!accumulate) {
    std::fill(dp, dp + positions_ * d, 0.f);
    if (!tied_) std::fill(dw, dw + vocab_ * d, 0.f);  // tied: the head has written its part already
  }
  auto scatter = [&](const auto* g) {
    for (std::int64_t i = 0; i < rows; ++i) {  // in order: the sums are the same on every run
      float* wr = dw + std::int64_t(ids_[std::size_t(i)]) * d;
      float* pr = dp + (i % t) * d;
      const auto* gr = g + i * d;
      for (std::int64_t k = 0; k < d; ++k) {
        const float v = as_float(gr[k]);
        wr[k] += v, pr[k] += v;
      }
    }
  };
  if (dy.dtype() == DType::bf16) scatter(dy.data<bfloat16>());
  else scatter(dy.data<float>());
  return {};  // token ids have no gradient
}

void TokenEmbedding::release_activations() {
  y_ = Tensor();
  ids_.clear();
  ids_.shrink_to_fit();
}

// ---- LmHead -----------------------------------------------------------------
LmHead::LmHead(std::string name, std::string tie, std::int64_t vocab, std::int64_t dim)
    : Layer(std::move(name)), tie_(std::move(tie)), vocab_(vocab), dim_(dim) {
  RT_CHECK(vocab > 0 && dim > 0, "LmHead '", name_, "': vocab (", vocab, ") and width (", dim, ") must be positive");
}

void LmHead::bind(const BindContext& ctx) {
  std::size_t i = 0;
  try {
    i = ctx.arena.index_of(tie_ + ".weight");
  } catch (const Error&) {
    RT_FAIL("LmHead '", name_, "': the embedding it is tied to, '", tie_, "', is not on this pipeline stage (its "
            "weight ", tie_, ".weight is not among the stage's parameters)");
  }
  RT_CHECK(ctx.arena.info(i).shape == (Shape{vocab_, dim_}), "LmHead '", name_, "': the tied weight ", tie_,
           ".weight is ", shape_str(ctx.arena.info(i).shape), ", expected [", vocab_, ", ", dim_, "]");
  weight = ctx.arena.param(i);
  dweight = ctx.arena.grad(i);
  be_ = &ctx.backend;
  arena_ = &ctx.arena;
  w16_valid_ = false;
  LinearSpec s{dim_, vocab_, false, false};
  s.math = ctx.math;
  k_ = ctx.backend.linear(s);
}

Shape LmHead::output_shape(const Shape& in) const {
  RT_CHECK(in.size() == 3 && in[2] == dim_, "LmHead '", name_, "': expects tokens [N, T, ", dim_, "], got ",
           shape_str(in));
  return {in[0], in[1], vocab_};
}

double LmHead::forward_flops(const Shape& in) const { return 2.0 * double(in[0] * in[1]) * double(dim_ * vocab_); }

const Tensor& LmHead::weight_for(DType dt) {
  if (dt == weight.dtype()) return weight;
  if (!w16_valid_ || w16_version_ != arena_->version()) {
    ensure(w16_, weight.shape(), dt, weight.device());
    be_->cast(weight, w16_);
    w16_version_ = arena_->version();
    w16_valid_ = true;
  }
  return w16_;
}

Tensor LmHead::do_forward(const Tensor& x, Mode) {
  x_ = x;
  const std::int64_t rows = x.dim(0) * x.dim(1);
  ensure(y_, {x.dim(0), x.dim(1), vocab_}, DType::f32, x.device());  // float32 logits at every precision
  Tensor y2 = y_.reshape({rows, vocab_});
  k_->forward(x.reshape({rows, dim_}), weight_for(x.dtype()), Tensor(), y2);
  return y_;
}

Tensor LmHead::do_backward(const Tensor& dy, bool need_dx, bool accumulate) {
  const std::int64_t rows = x_.dim(0) * x_.dim(1);
  Tensor dx, dx2, none;
  if (need_dx) {
    dx = ensure(dx_, x_.shape(), x_.dtype(), x_.device());
    dx2 = dx.reshape({rows, dim_});
  }
  Tensor dw = dweight;
  k_->backward(x_.reshape({rows, dim_}), weight_for(x_.dtype()), y_.reshape({rows, vocab_}),
               dy.reshape({rows, vocab_}), dx2, dw, none, accumulate);
  return dx;
}

void LmHead::release_activations() { x_ = y_ = dx_ = Tensor(); }

}  // namespace ringtrain
