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
//
// Vocabulary parallelism (Megatron-LM's, at parallel.tensor = P > 1 where P
// divides the vocabulary V; the builder passes the model's TensorGroup, else a
// group of 1): the embedding's weight is split by rows, rank r holding the
// tokens [r V/P, (r+1) V/P) (a ShardSpec of the whole [V, dim], so checkpoints
// save it whole and reshard it, and its initial values are that slice of the
// 1-rank weight's). Its forward looks up the tokens it holds (zeros for the
// others) and all-reduces the partial embeddings over the group (every
// token's row comes from exactly one rank, so the sum is exact); the position
// embedding is replicated and added after it. The backward is local. With
// sequence parallelism before transformer blocks (scatter_tokens), the sum is
// a reduce-scatter instead (Megatron's): the output is this rank's token
// shard [N, T/P, dim] (tensor_parallel.hpp), and the backward all-gathers its
// gradient first. The head multiplies by the local rows: its logits are
// [N, T, V/P], this rank's tokens' columns (the loss is
// vocab_parallel_cross_entropy, nn/lm_loss.hpp, so no rank holds [N, T, V]);
// its input gradient, every rank's partial product, is all-reduced. A copy of
// the weight that a head reads on another pipeline stage must be split alike
// (rows [V/P, dim], the same ShardSpec).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/nn/layer.hpp"
#include "ringtrain/nn/tensor_group.hpp"

namespace ringtrain {

struct ContextGroup;  // nn/context_parallel.hpp

// ids [N, T] (T <= positions) -> weight[id] + pos_embed[t], [N, T, dim].
// Parameters "<name>.weight" [vocab, dim] and "<name>.pos_embed" [positions,
// dim], both N(0, 0.02^2) (GPT-2). An id that is not an integer in [0, vocab)
// is an Error naming the layer. CPU only. g: the group the vocabulary is
// split over (size 1: not split; its size must divide vocab).
class TokenEmbedding : public Layer {
 public:
  TokenEmbedding(std::string name, std::int64_t vocab, std::int64_t positions, std::int64_t dim,
                 TensorGroup g = {});
  const char* type() const override { return g_.size > 1 ? "VocabParallelEmbedding" : "TokenEmbedding"; }
  // bf16 activations: float32 ids in, bfloat16 rows out (the Stage names the
  // type). A split vocabulary sums its float32 lookups over the group and
  // rounds once after adding the position: the tensor-1 rows, bitwise.
  // Context parallelism keeps float32 activations (context_layers.cpp).
  bool takes_bf16() const override { return !cp_; }
  bool takes_token_ids() const override { return true; }
  void set_output_dtype(DType dt) override { out_dt_ = dt; }
  std::int64_t vocab() const { return vocab_; }  // the whole vocabulary
  std::int64_t dim() const { return dim_; }
  const TensorGroup& group() const { return g_; }
  // An LmHead reads and also writes this weight's gradient: always accumulate.
  void tie_to_head() { tied_ = true; }
  // Split vocabulary only: give this rank's token shard (see above).
  void scatter_tokens();
  // The tied LmHead is on a later pipeline stage, with a copy of the weight:
  // the gradient here is this layer's alone; the weight is marked copied.
  void head_elsewhere() { tied_ = false, copied_ = true; }
  // Context parallelism: keep this rank's tokens of the whole ids, at their
  // global positions (nn/context_parallel.hpp). Not with a split vocabulary.
  void shard_context(std::shared_ptr<const ContextGroup> g);
  CtxPtr make_ctx() const override { return ctx_of<Saved>(); }
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override;

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;

 private:
  std::int64_t vocab_, positions_, dim_;
  TensorGroup g_;
  std::int64_t local_, first_;  // this rank's rows: tokens [first_, first_ + local_)
  std::size_t w_ = 0, p_ = 0;
  bool tied_ = false, scatter_ = false, copied_ = false;
  DType out_dt_ = DType::f32;
  Tensor weight, pos, dweight, dpos;
  struct Saved {
    Tensor y;
    Tensor rows;  // i32 per token: its row here, or -1 (another rank's); on the layer's device
  };
  Backend* be_ = nullptr;
  void lookup(const Tensor& ids, const Tensor& positions, Tensor& rows, Tensor& y) const;
  std::shared_ptr<const ContextGroup> cp_;
  Tensor forward_context(const Tensor& x, Saved& s) const;
  void backward_context(const Tensor& dy, Saved& s) const;
};

// x [N, T, dim] -> logits [N, T, vocab] = x W^T, W the tied embedding's weight
// [vocab, dim] (the backend's Linear kernel, no bias). g: the embedding's
// group; at size > 1 the logits are [N, T, vocab / size] (see above).
// bfloat16 activations multiply with a bf16 copy of W (this rank's rows at
// size > 1; cast when the arena's version moves on) and give float32 logits
// (the loss's type: no rounding of them, no cast of [N, T, vocab]); a split
// vocabulary's input gradient is summed over the group in float32 and
// rounded once (tp_all_reduce).
class LmHead : public Layer {
 public:
  LmHead(std::string name, std::string tie, std::int64_t vocab, std::int64_t dim, TensorGroup g = {});
  const char* type() const override { return g_.size > 1 ? "VocabParallelLmHead" : "LmHead"; }
  bool takes_bf16() const override { return true; }
  const std::string& tie() const { return tie_; }
  // The group its logits' columns are split over, or null (whole logits).
  const TensorGroup* vocab_group() const { return g_.size > 1 ? &g_ : nullptr; }
  // Split logits: the vocabulary-parallel cross-entropy over the group (nn/lm_loss.hpp).
  std::shared_ptr<const Loss> output_loss() const override;
  // The tied embedding is on an earlier pipeline stage: the head registers a
  // copy of its weight (`owner`, the model's parameter `owner_index`) under
  // the same name and initialises it the same way.
  void hold_copy(const ParamInfo& owner, std::size_t owner_index);
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  CtxPtr make_ctx() const override { return ctx_of<Saved>(); }
  void bind(const BindContext& ctx) override;
  Shape output_shape(const Shape& in) const override;
  double forward_flops(const Shape& in) const override;

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;

 private:
  struct Saved {
    Tensor x, y, dx;
  };
  const Tensor& weight_for(DType dt) const;
  std::string tie_;
  std::int64_t vocab_, dim_;
  TensorGroup g_;
  std::int64_t local_;  // logits (weight rows) on this rank
  std::int64_t copy_of_ = -1;  // hold_copy: the owner's model index
  ParamInfo owner_;
  std::size_t copy_ = 0;       // the copy's arena index
  Tensor weight, dweight;
  WeightCopy w16_;
  std::unique_ptr<LinearKernel> k_;
  Backend* be_ = nullptr;
  const ParamArena* arena_ = nullptr;
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
// The same for a stage of several ranges [first, end) of the model (`layers`:
// the whole model as built; `model`: every layer's parameters registered in
// model order, index base 0): a head whose embedding is in one of the ranges
// shares its weight (nothing to do), else holds a copy; an embedding whose
// head is outside the ranges keeps its gradient to itself.
void split_tied_layers(std::vector<LayerPtr>& layers, const std::vector<std::pair<int, int>>& held,
                       const ParamArena& model);

}  // namespace ringtrain
