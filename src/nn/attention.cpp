// MultiHeadSelfAttention: qkv projection -> backend attention core -> output
// projection. The projections are ordinary layers (Linear, or column- and
// row-parallel ones in a tensor-parallel model), so this layer only owns the
// core's kernel and its buffers.
#include "ringtrain/nn/transformer.hpp"

#include "ringtrain/nn/context_parallel.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"

namespace ringtrain {

MultiHeadSelfAttention::MultiHeadSelfAttention(std::string name, std::int64_t heads, std::int64_t head_dim,
                                               LayerPtr qkv, LayerPtr proj, bool causal)
    : Layer(std::move(name)), heads_(heads), head_dim_(head_dim), qkv_(std::move(qkv)), proj_(std::move(proj)),
      causal_(causal) {
  RT_CHECK(heads_ > 0 && head_dim_ > 0, "MultiHeadSelfAttention '", name_, "': heads (", heads_, ") and head_dim (",
           head_dim_, ") must be positive");
  RT_CHECK(qkv_ && proj_, "MultiHeadSelfAttention '", name_, "': needs qkv and proj layers");
}

void MultiHeadSelfAttention::register_params(ParamArena& arena, int li, const std::string& prefix) {
  for (auto* l : {qkv_.get(), proj_.get()}) {
    l->register_params(arena, li, prefix + name_ + ".");
    params_.insert(params_.end(), l->params().begin(), l->params().end());
  }
}

void MultiHeadSelfAttention::bind(const BindContext& ctx) {
  qkv_->bind(ctx);
  proj_->bind(ctx);
  AttentionSpec s;
  s.heads = heads_;
  s.head_dim = head_dim_;
  s.math = ctx.math;
  s.causal = causal_;
  // Context parallelism: ring_attention.cpp or ulysses_attention.cpp (parallel.context_mode).
  k_ = cp_ ? context_attention(s, *cp_, ctx.backend) : ctx.backend.attention(s);
}

void MultiHeadSelfAttention::init(const ParamArena& arena, std::uint64_t seed) {
  qkv_->init(arena, seed);
  proj_->init(arena, seed);
}

Shape MultiHeadSelfAttention::output_shape(const Shape& in) const {
  RT_CHECK(in.size() == 3, "MultiHeadSelfAttention '", name_, "': expects tokens [N, T, D], got ", shape_str(in));
  const std::int64_t inner = heads_ * head_dim_;
  Shape q;
  try {
    q = qkv_->output_shape(in);
  } catch (const Error& e) {  // name this layer, not only its child
    RT_FAIL("MultiHeadSelfAttention '", name_, "': ", e.what());
  }
  RT_CHECK(q.size() == 3 && q[2] == 3 * inner, "MultiHeadSelfAttention '", name_, "': qkv gives ", shape_str(q),
           ", expected [N, T, 3 * ", heads_, " heads * ", head_dim_, "]");
  return proj_->output_shape({in[0], q[1], inner});  // q[1]: all tokens, also from a sequence shard
}

double MultiHeadSelfAttention::forward_flops(const Shape& in) const {
  const std::int64_t inner = heads_ * head_dim_, t = qkv_->output_shape(in)[1];
  // Q K^T and P V: 2 FLOPs per multiply-add, T*T*hd of each per sample and head.
  const double core = 2.0 * 2.0 * double(in[0]) * double(heads_) * double(t) * double(t) * double(head_dim_);
  return qkv_->forward_flops(in) + core + proj_->forward_flops({in[0], t, inner});
}

CtxPtr MultiHeadSelfAttention::make_ctx() const {
  auto c = std::make_unique<SavedCtx<Saved>>();
  c->s.qkv = qkv_->make_ctx();
  c->s.proj = proj_->make_ctx();
  return c;
}

Tensor MultiHeadSelfAttention::do_forward(const Tensor& x, Ctx& c, const Call& call) const {
  Saved& s = saved<Saved>(c);
  Tensor qkv = qkv_->forward(x, *s.qkv, call);
  ensure(s.core, {qkv.dim(0), qkv.dim(1), heads_ * head_dim_}, qkv.dtype(), qkv.device());
  k_->forward(qkv, s.core, state_in(s.ks, *k_));
  if (recompute_core_ && call.train()) s.ks.reset();  // the probabilities go; the backward recomputes them
  s.qkv_out = qkv;
  return proj_->forward(s.core, *s.proj, call);
}

Tensor MultiHeadSelfAttention::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  return backward_impl(dy, c, need_dx, accumulate, false);
}

Tensor MultiHeadSelfAttention::do_backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  return backward_impl(dy, c, need_dx, accumulate, true);
}

// proj's deferred gradient reads core and dy, qkv's its input and dcore: all
// kept in the contexts until the context's next forward.
void MultiHeadSelfAttention::do_backward_weight(Ctx& c) const {
  Saved& s = saved<Saved>(c);
  qkv_->backward_weight(*s.qkv);
  proj_->backward_weight(*s.proj);
}

bool MultiHeadSelfAttention::splits_backward() const { return qkv_->splits_backward() || proj_->splits_backward(); }

Tensor MultiHeadSelfAttention::backward_impl(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate,
                                             bool split) const {
  Saved& s = saved<Saved>(c);
  Tensor dcore = split ? proj_->backward_input(dy, *s.proj, true, accumulate)
                       : proj_->backward(dy, *s.proj, true, accumulate);
  ensure(s.dcore, s.qkv_out.shape(), s.qkv_out.dtype(), s.qkv_out.device());  // d qkv
  // The kernel is deterministic: core is rewritten with the bits it holds
  // (proj's deferred weight gradient may still read it).
  if (recompute_core_) k_->forward(s.qkv_out, s.core, state_in(s.ks, *k_));
  k_->backward(s.qkv_out, dcore, s.dcore, state_in(s.ks, *k_));
  if (recompute_core_) s.ks.reset();
  return split ? qkv_->backward_input(s.dcore, *s.qkv, need_dx, accumulate)
               : qkv_->backward(s.dcore, *s.qkv, need_dx, accumulate);
}

LayerPtr multi_head_attention(const std::string& name, std::int64_t dim, std::int64_t heads, const TensorGroup& g,
                              bool causal) {
  RT_CHECK(heads > 0 && dim > 0 && dim % heads == 0, "attention '", name, "': width ", dim,
           " is not divisible by the head count ", heads);
  RT_CHECK(heads % g.size == 0, "attention '", name, "': ", heads, " heads are not divisible by the tensor size ",
           g.size, " (heads are split over the tensor ranks)");
  LinearSpec q{dim, 3 * dim, true, false};
  LinearSpec p{dim, dim, true, false};
  return std::make_unique<MultiHeadSelfAttention>(
      name, heads / g.size, dim / heads, split_layer("qkv", q, Init::xavier_uniform, TensorSplit::column, g, 3),
      split_layer("proj", p, Init::xavier_uniform, TensorSplit::row, g), causal);
}

}  // namespace ringtrain
