// TokenEmbedding and the tied LmHead (nn/language.hpp).
#include <algorithm>
#include <cmath>

#include "init.hpp"
#include "ringtrain/nn/language.hpp"

namespace ringtrain {

// ---- TokenEmbedding ---------------------------------------------------------
TokenEmbedding::TokenEmbedding(std::string name, std::int64_t vocab, std::int64_t positions, std::int64_t dim)
    : Layer(std::move(name)), vocab_(vocab), positions_(positions), dim_(dim) {
  RT_CHECK(vocab > 0 && positions > 0 && dim > 0, "TokenEmbedding '", name_, "': vocab (", vocab, "), positions (",
           positions, ") and width (", dim, ") must be positive");
}

// One function for both, so a change to the embedding's initialisation reaches the copy.
void init_embedding_weight(const ParamArena& arena, std::size_t index, std::uint64_t seed) {
  detail::init_normal(arena, index, 0.02, seed);
}

void split_tied_layers(std::vector<LayerPtr>& layers, int first, int end, const ParamArena& before) {
  const int n = static_cast<int>(layers.size());
  for (int i = first; i < end; ++i) {
    if (auto* h = dynamic_cast<LmHead*>(layers[static_cast<std::size_t>(i)].get())) {
      // Its embedding came before the stage: its weight is among the earlier parameters.
      for (std::size_t w = 0; w < before.size(); ++w)
        if (before.info(w).name == h->tie() + ".weight") h->hold_copy(before.info(w), w);
    } else if (auto* e = dynamic_cast<TokenEmbedding*>(layers[static_cast<std::size_t>(i)].get())) {
      for (int j = end; j < n; ++j)
        if (auto* h = dynamic_cast<LmHead*>(layers[static_cast<std::size_t>(j)].get()); h && h->tie() == e->name())
          e->head_elsewhere();
    }
  }
}

void TokenEmbedding::register_params(ParamArena& arena, int li, const std::string& prefix) {
  w_ = add_param(arena, prefix, "weight", {vocab_, dim_}, DType::f32, true, li);
  p_ = add_param(arena, prefix, "pos_embed", {positions_, dim_}, DType::f32, false, li);
  if (copied_) arena.set_copied(w_);
}

void TokenEmbedding::bind(const BindContext& ctx) {
  RT_CHECK(ctx.device.is_cpu(), "TokenEmbedding '", name_, "': runs on the CPU only, not ", ctx.device.str());
  weight = ctx.arena.param(w_);
  pos = ctx.arena.param(p_);
  dweight = ctx.arena.grad(w_);
  dpos = ctx.arena.grad(p_);
}

void TokenEmbedding::init(const ParamArena& arena, std::uint64_t seed) {
  init_embedding_weight(arena, w_, seed);
  detail::init_normal(arena, p_, 0.02, seed);
}

Shape TokenEmbedding::output_shape(const Shape& in) const {
  RT_CHECK(in.size() == 2 && in[1] >= 1 && in[1] <= positions_, "TokenEmbedding '", name_,
           "': expects token ids [N, T] with T <= ", positions_, " positions, got ", shape_str(in));
  return {in[0], in[1], dim_};
}

Tensor TokenEmbedding::do_forward(const Tensor& x, Mode) {
  const std::int64_t n = x.dim(0), t = x.dim(1), d = dim_;
  ensure(y_, {n, t, d}, DType::f32, x.device());
  ids_.resize(std::size_t(n * t));
  const float* id = x.data<float>();
  for (std::int64_t i = 0; i < n * t; ++i) {
    const float v = id[i];
    RT_CHECK(v >= 0 && v < float(vocab_) && v == std::floor(v), "TokenEmbedding '", name_, "': input ", i, " = ", v,
             " is not a token id in [0, ", vocab_, ")");
    ids_[std::size_t(i)] = std::int32_t(v);
  }
  const float *w = weight.data<float>(), *p = pos.data<float>();
  float* y = y_.data<float>();
  for (std::int64_t i = 0; i < n * t; ++i) {
    const float* wr = w + std::int64_t(ids_[std::size_t(i)]) * d;
    const float* pr = p + (i % t) * d;
    float* yr = y + i * d;
    for (std::int64_t k = 0; k < d; ++k) yr[k] = wr[k] + pr[k];
  }
  return y_;
}

Tensor TokenEmbedding::do_backward(const Tensor& dy, bool, bool accumulate) {
  const std::int64_t t = in_shape_[1], rows = in_shape_[0] * t, d = dim_;
  float *dw = dweight.data<float>(), *dp = dpos.data<float>();
  if (!accumulate) {
    std::fill(dp, dp + positions_ * d, 0.f);
    if (!tied_) std::fill(dw, dw + vocab_ * d, 0.f);  // tied: the head has written its part already
  }
  const float* g = dy.data<float>();
  for (std::int64_t i = 0; i < rows; ++i) {  // in order: the sums are the same on every run
    float* wr = dw + std::int64_t(ids_[std::size_t(i)]) * d;
    float* pr = dp + (i % t) * d;
    const float* gr = g + i * d;
    for (std::int64_t k = 0; k < d; ++k) wr[k] += gr[k], pr[k] += gr[k];
  }
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

void LmHead::hold_copy(const ParamInfo& owner, std::size_t owner_index) {
  const Shape& whole = owner.shard.sharded() ? owner.shard.global : owner.shape;
  RT_CHECK(whole == (Shape{vocab_, dim_}), "LmHead '", name_, "': the tied weight ", owner.name, " is ",
           shape_str(whole), ", expected [", vocab_, ", ", dim_, "]");
  owner_ = owner;
  copy_of_ = static_cast<std::int64_t>(owner_index);
}

void LmHead::register_params(ParamArena& arena, int li, const std::string&) {
  if (copy_of_ < 0) return;  // the embedding's weight is on this stage
  // Under the owner's name (checkpoints read it from the owner's entry), as
  // one of this layer's parameters: its gradient is ready with the head's backward.
  copy_ = arena.add(owner_.name, owner_.shape, owner_.dtype, owner_.decay, li);
  arena.set_copy_of(copy_, static_cast<std::size_t>(copy_of_));
  if (owner_.shard.sharded()) arena.set_shard(copy_, owner_.shard);  // split over the tensor ranks as the owner is
  params_.push_back(copy_);
}

void LmHead::init(const ParamArena& arena, std::uint64_t seed) {
  if (copy_of_ >= 0) init_embedding_weight(arena, copy_, seed);
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

Tensor LmHead::do_forward(const Tensor& x, Mode) {
  x_ = x;
  const std::int64_t rows = x.dim(0) * x.dim(1);
  ensure(y_, {x.dim(0), x.dim(1), vocab_}, DType::f32, x.device());
  Tensor y2 = y_.reshape({rows, vocab_});
  k_->forward(x.reshape({rows, dim_}), weight, Tensor(), y2);
  return y_;
}

Tensor LmHead::do_backward(const Tensor& dy, bool need_dx, bool accumulate) {
  const std::int64_t rows = x_.dim(0) * x_.dim(1);
  Tensor dx, dx2, none;
  if (need_dx) {
    dx = ensure(dx_, x_.shape(), DType::f32, x_.device());
    dx2 = dx.reshape({rows, dim_});
  }
  Tensor dw = dweight;
  k_->backward(x_.reshape({rows, dim_}), weight, y_.reshape({rows, vocab_}), dy.reshape({rows, vocab_}), dx2, dw,
               none, accumulate);
  return dx;
}

void LmHead::release_activations() { x_ = y_ = dx_ = Tensor(); }

}  // namespace ringtrain
