#pragma once
// Language-model layers (the `gpt` model, models.cpp): token ids in, per-token
// logits out. Token ids arrive as float32 [N, T] (the loader's batch, exact
// below 2^24); logits leave as [N, T, vocab] for the per-token softmax
// cross-entropy (nn/loss.hpp).
//
// Tying: LmHead has no parameters of its own; it multiplies by the weight of
// the TokenEmbedding named `tie` ("<tie>.weight", found in the arena when
// bound). On one stage, the head's backward writes that weight's gradient
// first (it runs first) and the embedding then adds its part: tie_to_head()
// marks the embedding so it always accumulates. On different pipeline stages
// (split_tied_layers, Megatron's "word embeddings for head"), the head holds
// a copy of the weight under the same name, initialised like the embedding's
// (the same model index), and each writes its own gradient; the stages sum
// the two every step (parallel/grad_sync.hpp), so the copies stay equal.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/nn/layer.hpp"

namespace ringtrain {

// ids [N, T] (T <= positions) -> weight[id] + pos_embed[t], [N, T, dim].
// Parameters "<name>.weight" [vocab, dim] and "<name>.pos_embed" [positions,
// dim], both N(0, 0.02^2) (GPT-2). An id that is not an integer in [0, vocab)
// is an Error naming the layer. CPU only.
class TokenEmbedding : public Layer {
 public:
  TokenEmbedding(std::string name, std::int64_t vocab, std::int64_t positions, std::int64_t dim);
  const char* type() const override { return "TokenEmbedding"; }
  std::int64_t vocab() const { return vocab_; }
  std::int64_t dim() const { return dim_; }
  // An LmHead reads and also writes this weight's gradient: always accumulate.
  void tie_to_head() { tied_ = true; }
  // The tied LmHead is on a later pipeline stage, with a copy of the weight:
  // the gradient here is this layer's alone; the weight is marked copied.
  void head_elsewhere() { tied_ = false, copied_ = true; }
  void release_activations() override;
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override;

 protected:
  Tensor do_forward(const Tensor& x, Mode mode) override;
  Tensor do_backward(const Tensor& dy, bool need_dx, bool accumulate) override;

 private:
  std::int64_t vocab_, positions_, dim_;
  std::size_t w_ = 0, p_ = 0;
  bool tied_ = false, copied_ = false;
  Tensor weight, pos, dweight, dpos, y_;
  std::vector<std::int32_t> ids_;
};

// x [N, T, dim] -> logits [N, T, vocab] = x W^T, W the tied embedding's weight
// [vocab, dim] (the backend's Linear kernel, no bias).
class LmHead : public Layer {
 public:
  LmHead(std::string name, std::string tie, std::int64_t vocab, std::int64_t dim);
  const char* type() const override { return "LmHead"; }
  const std::string& tie() const { return tie_; }
  // The tied embedding is on an earlier pipeline stage: the head registers a
  // copy of its weight (`owner`, the model's parameter `owner_index`) under
  // the same name and initialises it the same way.
  void hold_copy(const ParamInfo& owner, std::size_t owner_index);
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  void release_activations() override;
  void bind(const BindContext& ctx) override;
  Shape output_shape(const Shape& in) const override;
  double forward_flops(const Shape& in) const override;

 protected:
  Tensor do_forward(const Tensor& x, Mode mode) override;
  Tensor do_backward(const Tensor& dy, bool need_dx, bool accumulate) override;

 private:
  std::string tie_;
  std::int64_t vocab_, dim_;
  std::int64_t copy_of_ = -1;  // hold_copy: the owner's model index
  ParamInfo owner_;
  std::size_t copy_ = 0;       // the copy's arena index
  Tensor weight, dweight, x_, y_, dx_;
  std::unique_ptr<LinearKernel> k_;
};

// The initial values of a token embedding's weight (arena parameter `index`,
// drawn for its model index): the embedding and a head's copy of it alike.
void init_embedding_weight(const ParamArena& arena, std::size_t index, std::uint64_t seed);

// A pipeline stage of the model's top-level layers [first, end) (`layers`, as
// built, those before `first` possibly gone; `before`: the parameters of layers
// [0, first) registered in model order): an LmHead in the range whose
// embedding is before it holds a copy of its weight, and a TokenEmbedding in
// the range whose head comes after it keeps its gradient to itself. Call
// before the range registers its parameters.
void split_tied_layers(std::vector<LayerPtr>& layers, int first, int end, const ParamArena& before);

}  // namespace ringtrain
