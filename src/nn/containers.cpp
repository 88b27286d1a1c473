// Sequential and Residual: composite layers. Their children are bound to the
// same backend; a composite reports its gradients ready once, after all of its
// children (a stage's hook works on top-level layers).
#include "ringtrain/nn/layers.hpp"

namespace ringtrain {
namespace {

// cs[i] is ls[i]'s context.
std::vector<CtxPtr> chain_ctx(const std::vector<LayerPtr>& ls) {
  std::vector<CtxPtr> cs;
  for (auto& l : ls) cs.push_back(l->make_ctx());
  return cs;
}

Tensor chain_forward(const std::vector<LayerPtr>& ls, std::vector<CtxPtr>& cs, Tensor x, const Call& call) {
  for (std::size_t i = 0; i < ls.size(); ++i) x = ls[i]->forward(x, *cs[i], call);
  return x;
}

Tensor chain_backward(const std::vector<LayerPtr>& ls, std::vector<CtxPtr>& cs, Tensor g, bool need_dx,
                      bool accumulate) {
  for (std::size_t i = ls.size(); i-- > 0;) g = ls[i]->backward(g, *cs[i], i > 0 || need_dx, accumulate);
  return g;
}

Tensor chain_backward_input(const std::vector<LayerPtr>& ls, std::vector<CtxPtr>& cs, Tensor g, bool need_dx,
                            bool accumulate) {
  for (std::size_t i = ls.size(); i-- > 0;) g = ls[i]->backward_input(g, *cs[i], i > 0 || need_dx, accumulate);
  return g;
}

void chain_backward_weight(const std::vector<LayerPtr>& ls, std::vector<CtxPtr>& cs) {
  for (std::size_t i = ls.size(); i-- > 0;) ls[i]->backward_weight(*cs[i]);
}

bool chain_bf16(const std::vector<LayerPtr>& ls) {
  for (auto& l : ls)
    if (!l->takes_bf16()) return false;
  return true;
}

bool chain_splits(const std::vector<LayerPtr>& ls) {
  for (auto& l : ls)
    if (l->splits_backward()) return true;
  return false;
}

Shape chain_shape(const std::vector<LayerPtr>& ls, Shape s) {
  for (auto& l : ls) s = l->output_shape(s);
  return s;
}

double chain_flops(const std::vector<LayerPtr>& ls, Shape s) {
  double f = 0;
  for (auto& l : ls) {
    f += l->forward_flops(s);
    s = l->output_shape(s);
  }
  return f;
}

void append_buffers(const std::vector<LayerPtr>& ls, std::vector<NamedBuffer>& out) {
  for (auto& l : ls)
    for (auto& b : l->buffers()) out.push_back(b);
}

}  // namespace

// ---- Sequential -------------------------------------------------------------
Sequential::Sequential(std::string name, std::vector<LayerPtr> children)
    : Layer(std::move(name)), children_(std::move(children)) {
  RT_CHECK(!children_.empty(), "Sequential '", name_, "': needs at least one layer");
}

void Sequential::register_params(ParamArena& arena, int li, const std::string& prefix) {
  for (auto& c : children_) {
    c->register_params(arena, li, prefix + name_ + ".");
    params_.insert(params_.end(), c->params().begin(), c->params().end());
  }
}

void Sequential::bind(const BindContext& ctx) {
  for (auto& c : children_) c->bind(ctx);
}
void Sequential::init(const ParamArena& arena, std::uint64_t seed) {
  for (auto& c : children_) c->init(arena, seed);
}
Shape Sequential::output_shape(const Shape& in) const { return chain_shape(children_, in); }
double Sequential::forward_flops(const Shape& in) const { return chain_flops(children_, in); }
std::vector<NamedBuffer> Sequential::buffers() const {
  std::vector<NamedBuffer> out;
  append_buffers(children_, out);
  return out;
}
CtxPtr Sequential::make_ctx() const {
  auto c = std::make_unique<SavedCtx<Saved>>();
  c->s.children = chain_ctx(children_);
  return c;
}
Tensor Sequential::do_forward(const Tensor& x, Ctx& c, const Call& call) const {
  return chain_forward(children_, saved<Saved>(c).children, x, call);
}
Tensor Sequential::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  return chain_backward(children_, saved<Saved>(c).children, dy, need_dx, accumulate);
}
Tensor Sequential::do_backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  return chain_backward_input(children_, saved<Saved>(c).children, dy, need_dx, accumulate);
}
void Sequential::do_backward_weight(Ctx& c) const { chain_backward_weight(children_, saved<Saved>(c).children); }
bool Sequential::splits_backward() const { return chain_splits(children_); }
bool Sequential::takes_bf16() const { return chain_bf16(children_); }
void Sequential::for_each_child(const std::function<void(Layer&)>& f) {
  for (auto& c : children_) f(*c);
}

// ---- Residual ---------------------------------------------------------------
Residual::Residual(std::string name, std::vector<LayerPtr> body, std::vector<LayerPtr> shortcut, bool relu_after)
    : Layer(std::move(name)), body_(std::move(body)), shortcut_(std::move(shortcut)) {
  RT_CHECK(!body_.empty(), "Residual '", name_, "': needs a non-empty body");
  if (relu_after) post_ = std::make_unique<Activation>("relu", Eltwise::relu);
}

void Residual::register_params(ParamArena& arena, int li, const std::string& prefix) {
  for (auto& c : body_) c->register_params(arena, li, prefix + name_ + ".");
  for (auto& c : shortcut_) c->register_params(arena, li, prefix + name_ + ".shortcut.");
  for (auto* v : {&body_, &shortcut_})
    for (auto& c : *v) params_.insert(params_.end(), c->params().begin(), c->params().end());
}

void Residual::bind(const BindContext& ctx) {
  be_ = &ctx.backend;
  for (auto& c : body_) c->bind(ctx);
  for (auto& c : shortcut_) c->bind(ctx);
  if (post_) post_->bind(ctx);
}

void Residual::init(const ParamArena& arena, std::uint64_t seed) {
  for (auto& c : body_) c->init(arena, seed);
  for (auto& c : shortcut_) c->init(arena, seed);
}

Shape Residual::output_shape(const Shape& in) const {
  Shape a = chain_shape(body_, in);
  Shape b = chain_shape(shortcut_, in);
  RT_CHECK(a == b, "Residual '", name_, "': body gives ", shape_str(a), " but the shortcut gives ", shape_str(b),
           " for input ", shape_str(in));
  return a;
}

double Residual::forward_flops(const Shape& in) const {
  return chain_flops(body_, in) + chain_flops(shortcut_, in);
}

std::vector<NamedBuffer> Residual::buffers() const {
  std::vector<NamedBuffer> out;
  append_buffers(body_, out);
  append_buffers(shortcut_, out);
  return out;
}

CtxPtr Residual::make_ctx() const {
  auto c = std::make_unique<SavedCtx<Saved>>();
  c->s.body = chain_ctx(body_);
  c->s.shortcut = chain_ctx(shortcut_);
  if (post_) c->s.post = post_->make_ctx();
  return c;
}

Tensor Residual::do_forward(const Tensor& x, Ctx& c, const Call& call) const {
  Saved& s = saved<Saved>(c);
  Tensor h = chain_forward(body_, s.body, x, call);
  Tensor sc = chain_forward(shortcut_, s.shortcut, x, call);
  ensure(s.sum, h.shape(), h.dtype(), h.device());
  be_->add(h, sc, s.sum);
  return post_ ? post_->forward(s.sum, *s.post, call) : s.sum;
}

Tensor Residual::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  Saved& s = saved<Saved>(c);
  Tensor g = post_ ? post_->backward(dy, *s.post, true, accumulate) : dy;
  Tensor db = chain_backward(body_, s.body, g, need_dx, accumulate);
  Tensor ds = chain_backward(shortcut_, s.shortcut, g, need_dx, accumulate);
  if (!need_dx) return {};
  ensure(s.dx, db.shape(), db.dtype(), db.device());
  be_->add(db, ds, s.dx);
  return s.dx;
}

Tensor Residual::do_backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  Saved& s = saved<Saved>(c);
  Tensor g = post_ ? post_->backward_input(dy, *s.post, true, accumulate) : dy;
  Tensor db = chain_backward_input(body_, s.body, g, need_dx, accumulate);
  Tensor ds = chain_backward_input(shortcut_, s.shortcut, g, need_dx, accumulate);
  if (!need_dx) return {};
  ensure(s.dx, db.shape(), db.dtype(), db.device());
  be_->add(db, ds, s.dx);
  return s.dx;
}

void Residual::do_backward_weight(Ctx& c) const {
  Saved& s = saved<Saved>(c);
  chain_backward_weight(body_, s.body);
  chain_backward_weight(shortcut_, s.shortcut);
}

bool Residual::splits_backward() const { return chain_splits(body_) || chain_splits(shortcut_); }
bool Residual::takes_bf16() const { return chain_bf16(body_) && chain_bf16(shortcut_) && (!post_ || post_->takes_bf16()); }
void Residual::for_each_child(const std::function<void(Layer&)>& f) {
  for (auto* v : {&body_, &shortcut_})
    for (auto& c : *v) f(*c);
  if (post_) f(*post_);
}

}  // namespace ringtrain
