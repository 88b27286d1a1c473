#include "ringtrain/parallel/stage.hpp"

#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/language.hpp"
#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/recompute.hpp"

namespace ringtrain {
namespace {

// The BatchNorm2d layers under `l` (itself included), depth first.
void collect_bn(Layer& l, std::vector<BatchNorm2d*>& out) {
  if (auto* bn = dynamic_cast<BatchNorm2d*>(&l)) out.push_back(bn);
  l.for_each_child([&](Layer& c) { collect_bn(c, out); });
}

}  // namespace

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::none;
  if (s == "attention") return Recompute::attention;
  if (s == "block") return Recompute::block;
  RT_FAIL("train.recompute must be none, attention or block, got '", s, "'");
}

Stage::Stage(const ModelConfig& mc, Device dev, std::vector<LayerRange> ranges, int slots, bool chunked_buffers)
    : device_(dev) {
  RT_CHECK(slots >= 1, "pipeline stage: needs at least one activation slot");
  RT_CHECK(!ranges.empty(), "pipeline stage: needs at least one chunk of layers");
  // Layer objects hold no parameters until registered and bound: building the
  // whole list is cheap, and only the chunks' layers are ever allocated.
  std::vector<LayerPtr> all = build_model_layers(mc, dev);
  const int n = static_cast<int>(all.size());
  for (std::size_t c = 0; c < ranges.size(); ++c) {
    const LayerRange r = ranges[c];
    RT_CHECK(r.first >= 0 && r.first < r.end && r.end <= n, "pipeline stage: chunk ", c, "'s layers [", r.first,
             ", ", r.end, ") out of the model's ", n);
    RT_CHECK(c == 0 || r.first >= ranges[c - 1].end, "pipeline stage: chunk ", c, " (layers [", r.first, ", ",
             r.end, ")) does not come after chunk ", c - 1, " (ending at ", ranges[c - 1].end, ")");
  }
  // Every layer's input shape and the model index of its first parameter
  // (init values are drawn per index), from a scratch copy of the model: a
  // layer registered twice would list its parameters twice.
  std::vector<Shape> in(static_cast<std::size_t>(n));
  std::vector<std::size_t> first_param(static_cast<std::size_t>(n));
  ParamArena model;
  {
    std::vector<LayerPtr> scratch = build_model_layers(mc, dev);
    Shape s = model_input_shape(mc, 1);
    for (int i = 0; i < n; ++i) {
      in[static_cast<std::size_t>(i)] = s;
      first_param[static_cast<std::size_t>(i)] = model.next_model_index();  // an expert rank skips others' experts
      scratch[static_cast<std::size_t>(i)]->register_params(model, i, "");
      if (i + 1 < n) s = scratch[static_cast<std::size_t>(i)]->output_shape(s);
    }
  }
  std::vector<std::pair<int, int>> held;
  for (const LayerRange& r : ranges) held.emplace_back(r.first, r.end);
  split_tied_layers(all, held, model);  // a tied LM head apart from its embedding holds a copy

  for (const LayerRange& r : ranges) {
    Chunk ch;
    ch.range = r;
    ch.local0 = num_layers();
    const Shape& s = in[static_cast<std::size_t>(r.first)];
    ch.sample_in.assign(s.begin() + 1, s.end());
    arena_.set_index_base(first_param[static_cast<std::size_t>(r.first)]);
    for (int i = r.first; i < r.end; ++i) {
      layers_.push_back(std::move(all[static_cast<std::size_t>(i)]));
      layers_.back()->register_params(arena_, i, "");
    }
    int f = ch.local0;  // the first layer with parameters (or the last)
    while (f + 1 < num_layers() && layers_[static_cast<std::size_t>(f)]->params().empty()) ++f;
    ch.first_param_layer = f;
    ch.slots.resize(static_cast<std::size_t>(slots));
    chunks_.push_back(std::move(ch));
  }
  arena_.finalize(dev, chunked_buffers);
  BindContext ctx{backend_for(dev), dev, arena_, mc.seed, mc.math};
  for (auto& l : layers_) l->bind(ctx);
  for (auto& l : layers_) l->init(arena_, mc.seed);  // the initial parameters and buffers, once
  cast_ = ActivationCast::choose(mc, dev, layers_);
  make_contexts();
}

Stage::Stage(const ModelConfig& mc, Device dev, int first, int end, int slots)
    : Stage(mc, dev, std::vector<LayerRange>{{first, end}}, slots) {}

Stage::Stage(const ModelConfig& mc, Device dev)
    : Stage(mc, dev, 0, static_cast<int>(plan_model_layers(mc, dev).size()), 1) {}

Stage::~Stage() = default;

void Stage::make_contexts() {
  for (Chunk& ch : chunks_)
    for (Slot& sl : ch.slots) {
      sl = Slot{};
      for (int i = ch.local0; i < ch.local0 + (ch.range.end - ch.range.first); ++i)
        sl.ctx.push_back(layers_[static_cast<std::size_t>(i)]->make_ctx());
    }
}

Stage::Slot& Stage::slot_of(int chunk, int slot) {
  RT_CHECK(chunk >= 0 && chunk < num_chunks(), "pipeline stage: no chunk ", chunk, " (it has ", num_chunks(), ")");
  auto& slots = chunks_[static_cast<std::size_t>(chunk)].slots;
  RT_CHECK(slot >= 0 && slot < static_cast<int>(slots.size()), "pipeline stage: no activation slot ", slot,
           " (it has ", slots.size(), ")");
  return slots[static_cast<std::size_t>(slot)];
}

void Stage::set_recompute(Recompute r) {
  RT_CHECK(recompute_ != Recompute::block || r == Recompute::block,
           "pipeline stage: block recomputation cannot be turned off once set");
  for (auto& l : layers_) recompute_attention(*l, r == Recompute::attention);
  if (r == Recompute::block)
    for (auto& l : layers_) l = recomputed(std::move(l));
  recompute_ = r;
  make_contexts();
}

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

Shape Stage::input_shape(int chunk, std::int64_t n) const {
  const Chunk& ch = chunks_.at(static_cast<std::size_t>(chunk));
  Shape s = {n};
  s.insert(s.end(), ch.sample_in.begin(), ch.sample_in.end());
  return s;
}

Shape Stage::output_shape(int chunk, std::int64_t n) const {
  const Chunk& ch = chunks_.at(static_cast<std::size_t>(chunk));
  Shape s = input_shape(chunk, n);
  for (int i = ch.local0; i < ch.local0 + (ch.range.end - ch.range.first); ++i)
    s = layers_[static_cast<std::size_t>(i)]->output_shape(s);
  return s;
}

std::vector<NamedBuffer> Stage::buffers() const {
  std::vector<NamedBuffer> b;
  for (auto& l : layers_)
    for (auto& nb : l->buffers()) b.push_back(nb);
  return b;
}

void Stage::zero_grads() {
  if (!fused_) return arena_.zero_grads();
  for (Chunk& ch : chunks_) ch.overwrite_next = true;
}

Tensor Stage::forward(int chunk, int slot, const Tensor& x, Mode mode, const SamplePosition& pos) {
  Slot& sl = slot_of(chunk, slot);
  const Chunk& ch = chunks_[static_cast<std::size_t>(chunk)];
  const Call call(mode, pos);
  const int a = ch.local0;
  Tensor h = cast_.input(sl.cast, x, *layers_[static_cast<std::size_t>(a)]);
  for (std::size_t k = 0; k < sl.ctx.size(); ++k) {
    const int i = a + static_cast<int>(k);
    use(i, ParamAccess::Pass::forward);
    h = layers_[static_cast<std::size_t>(i)]->forward(h, *sl.ctx[k], call);
  }
  end_pass();
  return cast_.output(sl.cast, h);
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
  std::vector<BatchNorm2d*> bns;
  for (auto& l : layers_) collect_bn(*l, bns);
  for (auto* bn : bns) bn->commit_deferred_stats();
}

Tensor Stage::backward_input(int chunk, int slot, const Tensor& dy, bool need_dx, const GradReady& ready) {
  return backward_pass(chunk, slot, dy, need_dx, fused_, ready, fused_ ? ready : GradReady{});
}

Tensor Stage::backward_whole(int chunk, int slot, const Tensor& dy, bool need_dx, const GradReady& ready_input,
                             const GradReady& ready_weight) {
  return backward_pass(chunk, slot, dy, need_dx, true, ready_input, ready_weight);
}

// whole: each layer's unsplit backward (input and weight gradients together).
// A layer's gradients are announced by ready_input when it does not split its
// backward, else by ready_weight (the caller's counts of I's and W's differ).
Tensor Stage::backward_pass(int chunk, int slot, const Tensor& dy, bool need_dx, bool whole,
                            const GradReady& ready_input, const GradReady& ready_weight) {
  Slot& sl = slot_of(chunk, slot);
  Chunk& ch = chunks_[static_cast<std::size_t>(chunk)];
  const int a = ch.local0, stop = need_dx ? a : ch.first_param_layer;
  Tensor g = cast_.grad_output(sl.cast, dy);
  // A fused stage's first backward of the step overwrites the gradients; a split one zeroed them.
  const bool accumulate = !(fused_ && ch.overwrite_next);
  if (fused_) ch.overwrite_next = false;
  for (int i = a + static_cast<int>(sl.ctx.size()); i-- > stop;) {
    const Layer& l = *layers_[static_cast<std::size_t>(i)];
    Ctx& c = *sl.ctx[static_cast<std::size_t>(i - a)];
    use(i, ParamAccess::Pass::backward);
    const bool dx = need_dx || i > stop;
    g = whole ? l.backward(g, c, dx, accumulate) : l.backward_input(g, c, dx, true);
    if (l.params().empty()) continue;
    const GradReady& ready = l.splits_backward() ? ready_weight : ready_input;
    if (ready && (whole || !l.splits_backward())) ready(i);
  }
  end_pass();
  if (!need_dx || !g.defined()) return Tensor();  // token ids have no gradient
  return cast_.grad_input(sl.cast, g);  // float32 at the boundary
}

void Stage::backward_weight(int chunk, int slot, const GradReady& ready) {
  if (fused_) return;  // done in backward_input
  Slot& sl = slot_of(chunk, slot);
  const int a = chunks_[static_cast<std::size_t>(chunk)].local0;
  for (int i = a + static_cast<int>(sl.ctx.size()); i-- > a;) {
    const Layer& l = *layers_[static_cast<std::size_t>(i)];
    if (l.splits_backward()) use(i, ParamAccess::Pass::weight);
    l.backward_weight(*sl.ctx[static_cast<std::size_t>(i - a)]);
    if (ready && !l.params().empty() && l.splits_backward()) ready(i);
  }
  end_pass();
}

}  // namespace ringtrain
