#include "ringtrain/parallel/stage.hpp"

#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/language.hpp"
#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/transformer.hpp"

namespace ringtrain {
namespace {

// The BatchNorm2d layers under `l` (itself included), depth first.
void collect_bn(Layer& l, std::vector<BatchNorm2d*>& out) {
  if (auto* bn = dynamic_cast<BatchNorm2d*>(&l)) out.push_back(bn);
  l.for_each_child([&](Layer& c) { collect_bn(c, out); });
}

void collect_attention(Layer& l, std::vector<MultiHeadSelfAttention*>& out) {
  if (auto* a = dynamic_cast<MultiHeadSelfAttention*>(&l)) out.push_back(a);
  l.for_each_child([&](Layer& c) { collect_attention(c, out); });
}

}  // namespace

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::none;
  if (s == "attention") return Recompute::attention;
  if (s == "block") return Recompute::block;
  RT_FAIL("train.recompute must be none, attention or block, got '", s, "'");
}

void Stage::set_recompute(Recompute r) {
  recompute_ = r;
  for (auto& l : layers_) {
    std::vector<MultiHeadSelfAttention*> attn;
    collect_attention(*l, attn);
    for (auto* a : attn) a->set_recompute_core(r == Recompute::attention);
  }
  inputs_.assign(states_.size(), {});
  slot_position_.assign(states_.size(), {});
}

// Puts a slot's micro-batch state into the layers for one pass and takes it
// out again, also when the pass throws. One slot: the layers keep it.
class Stage::Loaded {
 public:
  Loaded(Stage& st, int slot) : st_(st), s_(st.states_.size() > 1 ? &st.states_.at(static_cast<std::size_t>(slot)) : nullptr) {
    swap();
  }
  ~Loaded() { swap(); }
  Loaded(const Loaded&) = delete;
  Loaded& operator=(const Loaded&) = delete;

 private:
  void swap() {
    if (s_)
      for (auto& l : st_.layers_) l->swap_state(*s_);
  }
  Stage& st_;
  MicroBatchState* s_;
};

void Stage::replay(int slot, int local) {
  struct Restore {  // the position the next forward expects, even on an error
    SamplePosition& p;
    SamplePosition keep;
    ~Restore() { p = keep; }
  } restore{position_, position_};
  position_ = slot_position_[static_cast<std::size_t>(slot)];
  position_.replay = true;
  auto& in = inputs_[static_cast<std::size_t>(slot)];
  layers_[static_cast<std::size_t>(local)]->forward(in[static_cast<std::size_t>(local)], Mode::train);
  in[static_cast<std::size_t>(local)] = Tensor();  // the layer holds it now, until released
}

Stage::Stage(const ModelConfig& mc, Device dev, int first, int end, int slots)
    : device_(dev), first_(first), end_(end) {
  RT_CHECK(slots >= 1, "pipeline stage: needs at least one activation slot");
  // Layer objects hold no parameters until registered and bound: building the
  // whole list per slot is cheap, and only [first, end) is ever allocated.
  std::vector<LayerPtr> all = build_model_layers(mc, dev);
  const int n = static_cast<int>(all.size());
  RT_CHECK(first >= 0 && first < end && end <= n, "pipeline stage: layers [", first, ", ", end,
           ") out of the model's ", n);
  // The stage's input shape (the model's sample shape through the earlier
  // layers) and the model index of its first parameter (init values are drawn per index).
  Shape s = model_input_shape(mc, 1);
  ParamArena before;
  for (int i = 0; i < first; ++i) {
    s = all[static_cast<std::size_t>(i)]->output_shape(s);
    all[static_cast<std::size_t>(i)]->register_params(before, i, "");
  }
  sample_in_.assign(s.begin() + 1, s.end());
  arena_.set_index_base(before.size());

  split_tied_layers(all, first, end, before);  // a tied LM head apart from its embedding holds a copy
  for (int i = first; i < end; ++i) layers_.push_back(std::move(all[static_cast<std::size_t>(i)]));
  for (int i = first; i < end; ++i) layers_[i - first]->register_params(arena_, i, "");
  arena_.finalize(dev);
  BindContext ctx{backend_for(dev), dev, arena_, mc.seed, mc.math, &position_};
  for (auto& l : layers_) l->bind(ctx);
  for (auto& l : layers_) l->init(arena_, mc.seed);  // the initial parameters and buffers, once
  states_.resize(static_cast<std::size_t>(slots));
  if (slots > 1) {  // every layer must list what its micro-batches keep
    MicroBatchState probe;
    for (auto& l : layers_) l->swap_state(probe);
    for (auto& l : layers_) l->swap_state(probe);
    RT_CHECK(probe.unlisted_layer().empty(), "pipeline stage: layer ", probe.unlisted_layer(),
             " does not list its per-micro-batch state (Layer::visit_state), and the schedule keeps ", slots,
             " micro-batches in flight on this stage");
  }
  // 16-bit storage: bf16, or fp16 (loss-scaled) where the backend takes it; not fp16 with token ids (CPU only).
  const Backend& be = backend_for(dev);
  const DType half = !mc.storage16                                        ? DType::f32
                     : mc.math == MathMode::bf16 && be.bf16_activations() ? DType::bf16
                     : mc.math == MathMode::fp16 && be.fp16_activations() ? DType::f16
                                                                          : DType::f32;
  bool all16 = half != DType::f32;
  for (auto& l : layers_) all16 = all16 && l->takes_bf16() && !(half == DType::f16 && l->takes_token_ids());
  act_ = all16 ? half : DType::f32;
  for (auto& l : layers_)
    if (l->takes_token_ids()) l->set_output_dtype(act_);
  for (auto* v : {&in16_, &out32_, &dy16_, &dx32_}) v->resize(states_.size());
  first_param_layer_ = 0;
  while (first_param_layer_ + 1 < num_layers() && layers_[first_param_layer_]->params().empty()) ++first_param_layer_;
}

Stage::Stage(const ModelConfig& mc, Device dev)
    : Stage(mc, dev, 0, static_cast<int>(plan_model_layers(mc, dev).size()), 1) {}

Stage::~Stage() = default;

std::pair<Shape, Shape> Stage::boundary_shapes(const ModelConfig& mc, Device dev, int first, int end,
                                               std::int64_t n) {
  std::vector<LayerPtr> all = build_model_layers(mc, dev);
  RT_CHECK(first >= 0 && first < end && end <= static_cast<int>(all.size()), "pipeline stage: layers [", first,
           ", ", end, ") out of the model's ", all.size());
  Shape s = model_input_shape(mc, n), in;
  for (int i = 0; i < end; ++i) {
    if (i == first) in = s;
    s = all[static_cast<std::size_t>(i)]->output_shape(s);
  }
  return {in, s};
}

Shape Stage::input_shape(std::int64_t n) const {
  Shape s = {n};
  s.insert(s.end(), sample_in_.begin(), sample_in_.end());
  return s;
}

Shape Stage::output_shape(std::int64_t n) const {
  Shape s = input_shape(n);
  for (auto& l : layers_) s = l->output_shape(s);
  return s;
}

std::vector<NamedBuffer> Stage::buffers() const {
  std::vector<NamedBuffer> b;
  for (auto& l : layers_)
    for (auto& nb : l->buffers()) b.push_back(nb);
  return b;
}

Tensor Stage::cast_to(std::vector<Tensor>& bufs, int slot, const Tensor& t, DType dt) {
  if (t.dtype() == dt) return t;
  Tensor& b = bufs.at(static_cast<std::size_t>(slot));
  if (!b.defined() || b.shape() != t.shape() || b.dtype() != dt || b.device() != t.device())
    b = Tensor::empty(t.shape(), dt, t.device());
  backend_for(device_).cast(t, b);
  return b;
}

Tensor Stage::forward(int slot, const Tensor& x, Mode mode) {
  Loaded loaded(*this, slot);
  auto& layers = layers_;
  const bool block = recompute_ == Recompute::block && mode == Mode::train;
  if (block) {
    slot_position_[static_cast<std::size_t>(slot)] = position_;
    inputs_[static_cast<std::size_t>(slot)].assign(layers.size(), Tensor());
  }
  Tensor h = act_ != DType::f32 && !layers[0]->takes_token_ids() ? cast_to(in16_, slot, x, act_) : x;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (block) inputs_[static_cast<std::size_t>(slot)][i] = h;
    use(static_cast<int>(i), ParamAccess::Pass::forward);
    h = layers[i]->forward(h, mode);
    if (block) layers[i]->release_activations();  // h and the kept input stay alive
  }
  end_pass();
  return act_ != DType::f32 ? cast_to(out32_, slot, h, DType::f32) : h;
}

int Stage::set_deferred_batch_stats(bool on) {
  std::vector<BatchNorm2d*> bns;
  for (auto& l : layers_) collect_bn(*l, bns);
  // Every running statistic must belong to a layer reached above, or a container
  // that hides its children would silently keep the per-micro-batch update.
  std::size_t stats = 0;
  for (auto& b : buffers()) stats += b.name.size() > 13 && b.name.ends_with(".running_mean");
  RT_CHECK(stats == bns.size(), "pipeline stage: found ", bns.size(), " BatchNorm2d layers but ", stats,
           " running means (a composite layer does not list its children in for_each_child)");
  for (auto* bn : bns) bn->set_deferred_stats(on);
  deferred_bn_ = on && !bns.empty();
  return static_cast<int>(bns.size());
}

void Stage::commit_batch_stats() {
  if (!deferred_bn_) return;
  for (auto& l : layers_) {
    std::vector<BatchNorm2d*> bns;
    collect_bn(*l, bns);
    for (auto* bn : bns) bn->commit_deferred_stats();
  }
}

Tensor Stage::backward_input(int slot, const Tensor& dy, bool need_dx, const GradReady& ready) {
  Loaded loaded(*this, slot);
  auto& layers = layers_;
  const int stop = need_dx ? 0 : first_param_layer_;
  const bool block = recompute_ == Recompute::block;
  // fp16: dy arrives loss-scaled (executor.cpp), so the scale is applied before this rounding (GradScaler's order).
  const Tensor dyl = act_ != DType::f32 ? cast_to(dy16_, slot, dy, act_) : dy;
  auto out = [&](const Tensor& g) {  // the stage's input gradient, float32 at the boundary
    if (!need_dx || !g.defined()) return Tensor();  // token ids have no gradient
    return act_ != DType::f32 ? cast_to(dx32_, slot, g, DType::f32) : g;
  };
  if (fused_) {
    const bool accumulate = !overwrite_next_;
    overwrite_next_ = false;
    Tensor g = dyl;
    for (int i = num_layers(); i-- > stop;) {
      use(i, ParamAccess::Pass::backward);
      if (block) replay(slot, i);
      g = layers[i]->backward(g, need_dx || i > stop, accumulate);
      if (block) layers[i]->release_activations();  // g, its input gradient, stays alive
      if (ready && !layers[i]->params().empty()) ready(i);
    }
    end_pass();
    if (block) inputs_[static_cast<std::size_t>(slot)].clear();
    return out(g);
  }
  Tensor g = dyl;
  for (int i = num_layers(); i-- > stop;) {
    use(i, ParamAccess::Pass::backward);
    if (block) replay(slot, i);
    g = layers[i]->backward_input(g, need_dx || i > stop, true);
    // A layer that defers its weight gradient keeps its activations until backward_weight.
    if (block && !layers[i]->splits_backward()) layers[i]->release_activations();
    if (ready && !layers[i]->params().empty() && !layers[i]->splits_backward()) ready(i);
  }
  end_pass();
  if (block) inputs_[static_cast<std::size_t>(slot)].clear();
  return out(g);
}

void Stage::backward_weight(int slot, const GradReady& ready) {
  if (fused_) return;  // done in backward_input
  Loaded loaded(*this, slot);
  auto& layers = layers_;
  for (int i = num_layers(); i-- > 0;) {
    if (layers[i]->splits_backward()) use(i, ParamAccess::Pass::weight);
    layers[i]->backward_weight();
    if (recompute_ == Recompute::block && layers[i]->splits_backward()) layers[i]->release_activations();
    if (ready && !layers[i]->params().empty() && layers[i]->splits_backward()) ready(i);
  }
  end_pass();
}

}  // namespace ringtrain
