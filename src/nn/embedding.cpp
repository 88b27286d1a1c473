// TokenEmbedding and the tied LmHead (nn/language.hpp), vocabulary-parallel over a tensor group.
#include <algorithm>
#include <cmath>

#include "init.hpp"
#include "ringtrain/nn/context_parallel.hpp"
#include "ringtrain/nn/language.hpp"
#include "ringtrain/nn/lm_loss.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"

namespace ringtrain {
namespace {

std::int64_t rows_of(const char* type, const std::string& name, std::int64_t vocab, const TensorGroup& g) {
  RT_CHECK(g.size >= 1 && vocab % g.size == 0, type, " '", name, "': the vocabulary of ", vocab,
           " tokens is not divisible by the ", g.size, " tensor ranks it is split over");
  return vocab / g.size;
}
}  // namespace

// ---- TokenEmbedding ---------------------------------------------------------
TokenEmbedding::TokenEmbedding(std::string name, std::int64_t vocab, std::int64_t positions, std::int64_t dim,
                               TensorGroup g)
    : Layer(std::move(name)), vocab_(vocab), positions_(positions), dim_(dim), g_(std::move(g)) {
  RT_CHECK(vocab > 0 && positions > 0 && dim > 0, "TokenEmbedding '", name_, "': vocab (", vocab, "), positions (",
           positions, ") and width (", dim, ") must be positive");
  local_ = rows_of("TokenEmbedding", name_, vocab_, g_);
  first_ = std::int64_t(g_.rank) * local_;
}

// One function for both, so a change to the embedding's initialisation reaches the copy.
// N(0, 0.02^2); a vocabulary-split weight gets its rows of the 1-rank weight
// (xavier_normal's std sqrt(2 / (fan_in + fan_out)) with both fans 1 / 0.02^2).
void init_embedding_weight(const ParamArena& arena, std::size_t index, std::uint64_t seed) {
  const double fan = 1.0 / (0.02 * 0.02);
  if (arena.info(index).shard.sharded()) detail::init_shard(arena, index, Init::xavier_normal, fan, fan, seed);
  else detail::init_normal(arena, index, 0.02, seed);
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

void split_tied_layers(std::vector<LayerPtr>& layers, const std::vector<std::pair<int, int>>& held,
                       const ParamArena& model) {
  auto holds = [&](int i) {
    for (auto [f, e] : held)
      if (i >= f && i < e) return true;
    return false;
  };
  const int n = static_cast<int>(layers.size());
  for (int i = 0; i < n; ++i) {
    if (!holds(i)) continue;
    if (auto* h = dynamic_cast<LmHead*>(layers[static_cast<std::size_t>(i)].get())) {
      for (std::size_t w = 0; w < model.size(); ++w)
        if (model.info(w).name == h->tie() + ".weight" && !holds(model.info(w).layer)) h->hold_copy(model.info(w), w);
    } else if (auto* e = dynamic_cast<TokenEmbedding*>(layers[static_cast<std::size_t>(i)].get())) {
      for (int j = 0; j < n; ++j)
        if (auto* h = dynamic_cast<LmHead*>(layers[static_cast<std::size_t>(j)].get());
            h && h->tie() == e->name() && !holds(j))
          e->head_elsewhere();
    }
  }
}

void TokenEmbedding::register_params(ParamArena& arena, int li, const std::string& prefix) {
  w_ = add_param(arena, prefix, "weight", {local_, dim_}, DType::f32, true, li);
  if (g_.size > 1) arena.set_shard(w_, make_shard({vocab_, dim_}, 0, g_.size, g_.rank));
  p_ = add_param(arena, prefix, "pos_embed", {positions_, dim_}, DType::f32, false, li);
  if (copied_) arena.set_copied(w_);
}

void TokenEmbedding::bind(const BindContext& ctx) {
  // The lookup, its adjoint and the positions are Backend ops; a split vocabulary's sums are the
  // tensor group's collectives on the same device.
  be_ = &ctx.backend;
  weight = ctx.arena.param(w_);
  pos = ctx.arena.param(p_);
  dweight = ctx.arena.grad(w_);
  dpos = ctx.arena.grad(p_);
}

void TokenEmbedding::init(const ParamArena& arena, std::uint64_t seed) {
  init_embedding_weight(arena, w_, seed);
  detail::init_normal(arena, p_, 0.02, seed);
}

void TokenEmbedding::scatter_tokens() {
  RT_CHECK(g_.size > 1, "TokenEmbedding '", name_, "': scatters tokens only with a split vocabulary");
  scatter_ = true;
}

Shape TokenEmbedding::output_shape(const Shape& in) const {
  RT_CHECK(in.size() == 2 && in[1] >= 1 && in[1] <= positions_, "TokenEmbedding '", name_,
           "': expects token ids [N, T] with T <= ", positions_, " positions, got ", shape_str(in));
  const Shape whole = {in[0], in[1], dim_};
  if (cp_) return scatter_ ? seq_shard_shape(context_shape(whole, *cp_), g_) : context_shape(whole, *cp_);
  return scatter_ ? seq_shard_shape(whole, g_) : whole;
}

// The backend's lookup, its errors (a bad token id) naming this layer.
void TokenEmbedding::lookup(const Tensor& ids, const Tensor& positions, Tensor& rows, Tensor& y) const {
  try {
    be_->embedding_forward(ids, vocab_, first_, weight, positions, rows, y);
  } catch (const Error& e) {
    RT_FAIL("TokenEmbedding '", name_, "': ", e.what());
  }
}

Tensor TokenEmbedding::do_forward(const Tensor& x, Ctx& c, const Call&) const {
  Saved& sv = saved<Saved>(c);
  Tensor &y_ = sv.y, &rows_ = sv.rows;
  const std::int64_t n = x.dim(0), t = x.dim(1), d = dim_;
  RT_CHECK(x.dtype() == DType::f32, "TokenEmbedding '", name_, "': token ids must be float32, got ",
           dtype_name(x.dtype()));
  if (cp_) return forward_context(x, sv);  // context_layers.cpp
  ensure(rows_, {n * t}, DType::i32, x.device());
  if (g_.size == 1) {  // the whole vocabulary: row + position, stored once (bf16 activations round here)
    ensure(y_, {n, t, d}, out_dt_, x.device());
    lookup(x, pos, rows_, y_);
    return y_;
  }
  // Split vocabulary: the partial lookups are float32 at either precision,
  // summed over the group (each token's row is on exactly one rank, so the sum
  // is that row, exactly), the position added in float32, and bf16
  // activations rounded once: the tensor-1 values, bitwise. Scattering, or
  // bf16, the float32 partials go to workspaces used within this call only.
  const bool f32 = out_dt_ == DType::f32;
  Tensor part = scatter_ || !f32 ? g_.workspace(TpBuffer::gathered_grad, {n, t, d}, DType::f32, x.device())
                                 : ensure(y_, {n, t, d}, DType::f32, x.device());
  lookup(x, Tensor{}, rows_, part);
  std::int64_t ts = t, t0 = 0;  // the output's tokens per sample and its first position
  Tensor sum = part;
  if (scatter_) {
    const Shape shard = seq_shard_shape(part.shape(), g_);
    sum = f32 ? ensure(y_, shard, DType::f32, x.device()) : g_.workspace(TpBuffer::sum_shard, shard, DType::f32, x.device());
    seq_reduce_scatter(part, sum, g_);
    ts = t / g_.size;
    t0 = std::int64_t(g_.rank) * ts;
  } else {
    tp_all_reduce(part, g_);
  }
  // The positions of the output's tokens added in float32 (in place), then one rounding to 16 bits.
  const Tensor p = pos.slice_rows(t0, t0 + ts);
  be_->add_broadcast(sum, p, 1, sum);
  if (!f32) be_->cast(sum, ensure(y_, sum.shape(), out_dt_, x.device()));
  return y_;
}

// The incoming gradient is the same on every tensor rank (the next layer's
// input gradient is reduced over the group): each adds its own rows' part.
Tensor TokenEmbedding::do_backward(const Tensor& dy, Ctx& c, bool, bool accumulate) const {
  if (!accumulate) {
    Tensor(dpos).zero_();  // the arena's gradient views (shared storage)
    if (!tied_) Tensor(dweight).zero_();  // tied: the head has written its part already
  }
  if (cp_) {
    backward_context(dy, saved<Saved>(c));  // context_layers.cpp
    return {};
  }
  Tensor dyw = dy;  // scattered: every token's gradient, for the rows of this rank's vocabulary
  if (scatter_) {
    dyw = g_.workspace(TpBuffer::gathered_grad, seq_whole_shape(dy.shape(), g_), dy.dtype(), dy.device());
    seq_all_gather(dy, dyw, g_);
  }
  Tensor dw = dweight, dp = dpos;
  be_->embedding_backward(dyw, saved<Saved>(c).rows, dw, dp);  // bf16 gradients widened to float32
  return {};  // token ids have no gradient
}

// ---- LmHead -----------------------------------------------------------------
std::shared_ptr<const Loss> LmHead::output_loss() const {
  return g_.size > 1 ? vocab_parallel_cross_entropy_loss(g_) : nullptr;
}

LmHead::LmHead(std::string name, std::string tie, std::int64_t vocab, std::int64_t dim, TensorGroup g)
    : Layer(std::move(name)), tie_(std::move(tie)), vocab_(vocab), dim_(dim), g_(std::move(g)) {
  RT_CHECK(vocab > 0 && dim > 0, "LmHead '", name_, "': vocab (", vocab, ") and width (", dim, ") must be positive");
  local_ = rows_of("LmHead", name_, vocab_, g_);
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
  RT_CHECK(ctx.arena.info(i).shape == (Shape{local_, dim_}), "LmHead '", name_, "': the tied weight ", tie_,
           ".weight is ", shape_str(ctx.arena.info(i).shape), ", expected [", local_, ", ", dim_, "]",
           g_.size > 1 ? cat(" (rows ", g_.rank * local_, " to ", (g_.rank + 1) * local_, " of the ", vocab_,
                             "-token vocabulary split over ", g_.size, " tensor ranks)")
                       : std::string());
  weight = ctx.arena.param(i);
  dweight = ctx.arena.grad(i);
  be_ = &ctx.backend;
  arena_ = &ctx.arena;
  w16_.invalidate();
  LinearSpec s{dim_, local_, false, false};
  s.math = ctx.math;
  k_ = ctx.backend.linear(s);
}

Shape LmHead::output_shape(const Shape& in) const {
  RT_CHECK(in.size() == 3 && in[2] == dim_, "LmHead '", name_, "': expects tokens [N, T, ", dim_, "], got ",
           shape_str(in));
  return {in[0], in[1], local_};
}

double LmHead::forward_flops(const Shape& in) const { return 2.0 * double(in[0] * in[1]) * double(dim_ * local_); }

const Tensor& LmHead::weight_for(DType dt) const {
  if (dt == weight.dtype()) return weight;
  return w16_.of(weight, dt, *be_, *arena_);
}

Tensor LmHead::do_forward(const Tensor& x, Ctx& c, const Call&) const {
  Saved& s = saved<Saved>(c);
  s.x = x;
  const std::int64_t rows = x.dim(0) * x.dim(1);
  ensure(s.y, {x.dim(0), x.dim(1), local_}, DType::f32, x.device());  // float32 logits at every precision
  Tensor y2 = s.y.reshape({rows, local_});
  k_->forward(x.reshape({rows, dim_}), weight_for(x.dtype()), Tensor(), y2);
  return s.y;
}

Tensor LmHead::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  Saved& s = saved<Saved>(c);
  const Tensor &x_ = s.x, &y_ = s.y;
  Tensor& dx_ = s.dx;
  const std::int64_t rows = x_.dim(0) * x_.dim(1);
  Tensor dx, dx2, none;
  if (need_dx) {
    dx = ensure(dx_, x_.shape(), x_.dtype(), x_.device());
    dx2 = dx.reshape({rows, dim_});
  }
  Tensor dw = dweight;
  k_->backward(x_.reshape({rows, dim_}), weight_for(x_.dtype()), y_.reshape({rows, local_}),
               dy.reshape({rows, local_}), dx2, dw, none, accumulate);
  // Split vocabulary: dx is this rank's rows' part of the sum (Megatron's f backward).
  if (need_dx && g_.size > 1) tp_all_reduce(dx, g_);
  return dx;
}

}  // namespace ringtrain
