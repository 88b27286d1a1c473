// LayerNorm, PatchEmbed, TokenMean, ResidualStack and the pre-norm
// transformer block: shape checks and bookkeeping; the math is the backend's.
#include "ringtrain/nn/transformer.hpp"

#include <cmath>

#include "init.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"

namespace ringtrain {

// ---- LayerNorm --------------------------------------------------------------
LayerNorm::LayerNorm(std::string name, std::int64_t features, double eps) : Layer(std::move(name)) {
  RT_CHECK(features > 0 && eps > 0, "LayerNorm '", name_, "': features (", features, ") and eps (", eps,
           ") must be positive");
  spec_.features = features;
  spec_.eps = eps;
}

void LayerNorm::register_params(ParamArena& arena, int li, const std::string& prefix) {
  g_ = add_param(arena, prefix, "weight", {spec_.features}, spec_.dtype, false, li);
  b_ = add_param(arena, prefix, "bias", {spec_.features}, spec_.dtype, false, li);
}

void LayerNorm::bind(const BindContext& ctx) {
  gamma = ctx.arena.param(g_);
  beta = ctx.arena.param(b_);
  dgamma = ctx.arena.grad(g_);
  dbeta = ctx.arena.grad(b_);
  k_ = ctx.backend.layernorm(spec_);
  be_ = &ctx.backend;
}

void LayerNorm::init(const ParamArena& arena, std::uint64_t) {
  detail::fill_param(arena, g_, 1.0);
  detail::fill_param(arena, b_, 0.0);
}

Shape LayerNorm::output_shape(const Shape& in) const {
  RT_CHECK(in.size() >= 2 && in.back() == spec_.features, "LayerNorm '", name_, "': expects input [..., ",
           spec_.features, "], got ", shape_str(in));
  return in;
}

CtxPtr LayerNorm::make_ctx() const { return ctx_of<Saved>(); }

Tensor LayerNorm::do_forward(const Tensor& x, Ctx& c, const Call&) const {
  Saved& s = saved<Saved>(c);
  s.x = x;
  ensure(s.y, x.shape(), x.dtype(), x.device());
  k_->forward(x, gamma, beta, s.y, state_in(s.ks, *k_));
  return s.y;
}

Tensor LayerNorm::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  Saved& s = saved<Saved>(c);
  Tensor dx;
  if (need_dx) dx = ensure(s.dx, s.x.shape(), s.x.dtype(), s.x.device());
  if (sum_over_.size == 1) {
    Tensor dg = dgamma, dbt = dbeta;
    k_->backward(s.x, gamma, dy, dx, dg, dbt, accumulate, state_in(s.ks, *k_));
    return dx;
  }
  // This rank's tokens' part of both gradients, summed over the group in one all-reduce.
  ensure(partial_, {2 * spec_.features}, dgamma.dtype(), dgamma.device());
  Tensor pg = partial_.flat_view(0, spec_.features), pb = partial_.flat_view(spec_.features, spec_.features);
  k_->backward(s.x, gamma, dy, dx, pg, pb, false, state_in(s.ks, *k_));
  tp_sum_partial(partial_, {dgamma, dbeta}, accumulate, sum_over_, *be_);
  return dx;
}

// ---- PatchEmbed -------------------------------------------------------------
PatchEmbed::PatchEmbed(std::string name, std::int64_t channels, std::int64_t height, std::int64_t width,
                       std::int64_t patch, std::int64_t dim)
    : Layer(std::move(name)), channels_(channels), height_(height), width_(width), patch_(patch), dim_(dim) {
  RT_CHECK(patch > 0 && dim > 0 && channels > 0, "PatchEmbed '", name_, "': patch (", patch, "), width (", dim,
           ") and channels (", channels, ") must be positive");
  RT_CHECK(height % patch == 0 && width % patch == 0, "PatchEmbed '", name_, "': image ", height, "x", width,
           " is not divisible into ", patch, "x", patch, " patches");
  LinearSpec s{channels * patch * patch, dim, true, false};
  proj_ = std::make_unique<Linear>("proj", s, Init::xavier_uniform);
}

void PatchEmbed::register_params(ParamArena& arena, int li, const std::string& prefix) {
  proj_->register_params(arena, li, prefix + name_ + ".");
  params_.insert(params_.end(), proj_->params().begin(), proj_->params().end());
  pos_ = add_param(arena, prefix, "pos_embed", {tokens(), dim_}, DType::f32, false, li);
}

void PatchEmbed::bind(const BindContext& ctx) {
  be_ = &ctx.backend;
  proj_->bind(ctx);
  pos = ctx.arena.param(pos_);
  dpos = ctx.arena.grad(pos_);
}

void PatchEmbed::init(const ParamArena& arena, std::uint64_t seed) {
  proj_->init(arena, seed);
  detail::init_normal(arena, pos_, 0.02, seed);
}

Shape PatchEmbed::output_shape(const Shape& in) const {
  RT_CHECK(in.size() == 4 && in[1] == channels_ && in[2] == height_ && in[3] == width_, "PatchEmbed '", name_,
           "': expects images [N, ", channels_, ", ", height_, ", ", width_, "], got ", shape_str(in));
  return {in[0], tokens(), dim_};
}

double PatchEmbed::forward_flops(const Shape& in) const {
  return proj_->forward_flops({in[0], tokens(), channels_ * patch_ * patch_});
}

CtxPtr PatchEmbed::make_ctx() const {
  auto c = std::make_unique<SavedCtx<Saved>>();
  c->s.proj = proj_->make_ctx();
  return c;
}

Tensor PatchEmbed::do_forward(const Tensor& x, Ctx& c, const Call& call) const {
  Saved& s = saved<Saved>(c);
  ensure(s.patches, {x.dim(0), tokens(), channels_ * patch_ * patch_}, x.dtype(), x.device());
  be_->patchify(x, patch_, s.patches);
  Tensor h = proj_->forward(s.patches, *s.proj, call);
  ensure(s.y, h.shape(), h.dtype(), h.device());
  be_->add_broadcast(h, pos, 1, s.y);
  return s.y;
}

Tensor PatchEmbed::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  Saved& s = saved<Saved>(c);
  Tensor dp_ = dpos;
  be_->sum_broadcast(dy, 1, dp_, accumulate);
  Tensor dp = proj_->backward(dy, *s.proj, need_dx, accumulate);
  if (!need_dx) return {};
  ensure(s.dx, c.in_shape, dy.dtype(), dy.device());
  be_->unpatchify(dp, patch_, s.dx);
  return s.dx;
}

// ---- TokenMean --------------------------------------------------------------
Shape TokenMean::output_shape(const Shape& in) const {
  RT_CHECK(in.size() == 3 && in[1] > 0, "TokenMean '", name_, "': expects tokens [N, T, D], got ", shape_str(in));
  return {in[0], in[2]};
}

CtxPtr TokenMean::make_ctx() const { return ctx_of<Saved>(); }

Tensor TokenMean::do_forward(const Tensor& x, Ctx& c, const Call&) const {
  Saved& s = saved<Saved>(c);
  ensure(s.y, {x.dim(0), x.dim(2)}, x.dtype(), x.device());
  be_->token_mean(x, s.y);
  return s.y;
}

Tensor TokenMean::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool) const {
  if (!need_dx) return {};
  Saved& s = saved<Saved>(c);
  ensure(s.dx, c.in_shape, dy.dtype(), dy.device());
  be_->token_mean_backward(dy, s.dx);
  return s.dx;
}

// ---- ResidualStack ----------------------------------------------------------
ResidualStack::ResidualStack(std::string name, std::vector<std::vector<LayerPtr>> branches, SequenceShard seq)
    : Layer(std::move(name)), branches_(std::move(branches)), seq_(std::move(seq)) {
  RT_CHECK(!branches_.empty(), "ResidualStack '", name_, "': needs at least one branch");
  for (auto& b : branches_) RT_CHECK(!b.empty(), "ResidualStack '", name_, "': a branch is empty");
}

void ResidualStack::register_params(ParamArena& arena, int li, const std::string& prefix) {
  for (auto& b : branches_)
    for (auto& c : b) {
      c->register_params(arena, li, prefix + name_ + ".");
      params_.insert(params_.end(), c->params().begin(), c->params().end());
    }
}

void ResidualStack::bind(const BindContext& ctx) {
  be_ = &ctx.backend;
  for (auto& b : branches_)
    for (auto& c : b) c->bind(ctx);
}

void ResidualStack::init(const ParamArena& arena, std::uint64_t seed) {
  for (auto& b : branches_)
    for (auto& c : b) c->init(arena, seed);
}

Shape ResidualStack::output_shape(const Shape& in) const {
  const Shape h = seq_.scatter_in ? seq_shard_shape(in, seq_.g) : in;  // the residual stream
  for (std::size_t i = 0; i < branches_.size(); ++i) {
    Shape s = h;
    for (auto& c : branches_[i]) s = c->output_shape(s);
    RT_CHECK(s == h, "ResidualStack '", name_, "': branch ", i, " maps ", shape_str(h), " to ", shape_str(s),
             "; a residual branch must keep the shape");
  }
  return seq_.gather_out ? seq_whole_shape(h, seq_.g) : h;
}

std::vector<NamedBuffer> ResidualStack::buffers() const {
  std::vector<NamedBuffer> out;
  for (auto& b : branches_)
    for (auto& c : b)
      for (auto& nb : c->buffers()) out.push_back(nb);
  return out;
}

void ResidualStack::for_each_child(const std::function<void(Layer&)>& f) {
  for (auto& b : branches_)
    for (auto& c : b) f(*c);
}

CtxPtr ResidualStack::make_ctx() const {
  auto c = std::make_unique<SavedCtx<Saved>>();
  for (auto& b : branches_) {
    c->s.branches.emplace_back();
    for (auto& l : b) c->s.branches.back().push_back(l->make_ctx());
  }
  return c;
}

bool ResidualStack::takes_bf16() const {
  for (auto& b : branches_)
    for (auto& c : b)
      if (!c->takes_bf16()) return false;
  return true;
}

double ResidualStack::forward_flops(const Shape& in) const {
  double f = 0;
  for (auto& b : branches_) {
    Shape s = seq_.scatter_in ? seq_shard_shape(in, seq_.g) : in;
    for (auto& c : b) {
      f += c->forward_flops(s);
      s = c->output_shape(s);
    }
  }
  return f;
}

Tensor ResidualStack::do_forward(const Tensor& x, Ctx& c, const Call& call) const {
  Saved& s = saved<Saved>(c);
  s.sums.resize(branches_.size());
  Tensor h = x;
  if (seq_.scatter_in) {
    ensure(s.xs, seq_shard_shape(x.shape(), seq_.g), x.dtype(), x.device());
    seq_slice(x, s.xs, seq_.g);
    h = s.xs;
  }
  for (std::size_t i = 0; i < branches_.size(); ++i) {
    Tensor b = h;
    for (std::size_t j = 0; j < branches_[i].size(); ++j) b = branches_[i][j]->forward(b, *s.branches[i][j], call);
    ensure(s.sums[i], h.shape(), h.dtype(), h.device());
    be_->add(h, b, s.sums[i]);
    h = s.sums[i];
  }
  if (!seq_.gather_out) return h;
  ensure(s.y, seq_whole_shape(h.shape(), seq_.g), h.dtype(), h.device());
  seq_all_gather(h, s.y, seq_.g);
  return s.y;
}

Tensor ResidualStack::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  return backward_impl(dy, c, need_dx, accumulate, false);
}

Tensor ResidualStack::do_backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  return backward_impl(dy, c, need_dx, accumulate, true);
}

void ResidualStack::do_backward_weight(Ctx& c) const {
  Saved& s = saved<Saved>(c);
  for (std::size_t i = branches_.size(); i-- > 0;)
    for (std::size_t j = branches_[i].size(); j-- > 0;) branches_[i][j]->backward_weight(*s.branches[i][j]);
}

bool ResidualStack::splits_backward() const {
  for (auto& b : branches_)
    for (auto& l : b)
      if (l->splits_backward()) return true;
  return false;
}

Tensor ResidualStack::backward_impl(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate, bool split) const {
  Saved& s = saved<Saved>(c);
  Tensor g = dy;
  if (seq_.gather_out) {  // dy is replicated (what follows runs on every rank alike): take our tokens
    ensure(s.dys, seq_shard_shape(dy.shape(), seq_.g), dy.dtype(), dy.device());
    seq_slice(dy, s.dys, seq_.g);
    g = s.dys;
  }
  for (std::size_t i = branches_.size(); i-- > 0;) {
    const bool more = i > 0 || need_dx;
    Tensor d = g;
    auto& br = branches_[i];
    for (std::size_t j = br.size(); j-- > 0;) {
      Layer& l = *br[j];
      d = split ? l.backward_input(d, *s.branches[i][j], j > 0 || more, accumulate)
                : l.backward(d, *s.branches[i][j], j > 0 || more, accumulate);
    }
    if (!more) return {};
    // g + d into our buffer; in place once g is that buffer (add allows
    // aliasing). Split, each branch's sum has its own: a branch that deferred
    // its weight gradient keeps its g as dy until backward_weight.
    if (split) s.dxs.resize(branches_.size());
    Tensor& out = split ? s.dxs[i] : s.dx;
    ensure(out, g.shape(), g.dtype(), g.device());
    be_->add(g, d, out);
    g = out;
  }
  if (!seq_.scatter_in) return g;
  ensure(s.dxw, c.in_shape, g.dtype(), g.device());
  seq_all_gather(g, s.dxw, seq_.g);
  return s.dxw;
}

// ---- the pre-norm transformer block -----------------------------------------
LayerPtr transformer_block(const std::string& name, const TransformerBlockSpec& s, const TensorGroup& g) {
  const auto hidden = static_cast<std::int64_t>(std::llround(double(s.dim) * s.mlp_ratio));
  RT_CHECK(hidden > 0, "transformer block '", name, "': mlp_ratio ", s.mlp_ratio, " gives no hidden units");
  RT_CHECK(hidden % g.size == 0, "transformer block '", name, "': its ", hidden,
           " hidden units are not divisible by the tensor size ", g.size);
  TensorGroup gs = g;
  gs.sequence = s.sequence && g.size > 1;
  auto norm = [&](const char* n) {
    auto l = std::make_unique<LayerNorm>(n, s.dim, s.eps);
    if (gs.sequence) l->sum_grads_over(gs);
    return l;
  };
  // Dropout streams are keyed by the layer name: unique per block.
  auto dropout = [&](const char* n) {
    auto l = std::make_unique<Dropout>(name + n, s.dropout);
    if (gs.sequence) l->shard_tokens(gs.size, gs.rank);
    return l;
  };
  std::vector<LayerPtr> attn, mlp;
  attn.push_back(norm("norm1"));
  attn.push_back(multi_head_attention("attn", s.dim, s.heads, gs, s.causal));
  if (s.dropout > 0) attn.push_back(dropout(".drop1"));
  mlp.push_back(norm("norm2"));
  if (s.moe.experts > 0) {
    // With tensor parallelism the experts are replicated over the tensor ranks
    // (only the dense parts are split). Under sequence parallelism each tensor
    // rank routes its own token shard (as Megatron-Core's MoE does): the layer
    // sums its routing totals and gradients over the group (MoeMlp::sum_grads_over).
    MoeSpec m = s.moe;
    m.dim = s.dim;
    m.hidden = hidden;
    m.gelu = s.gelu;
    auto moe = std::make_unique<MoeMlp>("moe", m, s.expert);
    if (gs.sequence) moe->sum_grads_over(gs);
    mlp.push_back(std::move(moe));
  } else {
    const LinearSpec fc1{s.dim, hidden, true, false}, fc2{hidden, s.dim, true, false};
    mlp.push_back(split_layer("fc1", fc1, Init::xavier_uniform, TensorSplit::column, gs));
    mlp.push_back(std::make_unique<Activation>("gelu", s.gelu));
    mlp.push_back(split_layer("fc2", fc2, Init::xavier_uniform, TensorSplit::row, gs));
  }
  if (s.dropout > 0) mlp.push_back(dropout(".drop2"));
  std::vector<std::vector<LayerPtr>> branches;
  branches.push_back(std::move(attn));
  branches.push_back(std::move(mlp));
  SequenceShard seq;
  if (gs.sequence) seq = {gs, s.seq_first, s.seq_last};
  return std::make_unique<ResidualStack>(name, std::move(branches), seq);
}

}  // namespace ringtrain
