#pragma once
// Transformer layers: tokens are [N, T, D] tensors (sample, token, feature).
// LayerNorm and Linear act on the last dimension; attention mixes tokens
// within a sample. The vision transformer (`vit`, models.cpp) is
//   PatchEmbed -> ResidualStack x depth -> LayerNorm -> TokenMean -> Linear.
//
// Tensor parallelism needs no new math: MultiHeadSelfAttention takes its qkv
// and output projections as layers (column- and row-parallel over a
// TensorGroup of size > 1) and its head count as a parameter (the local
// heads), and ResidualStack takes arbitrary branches. The block builders
// below take the group; size 1 builds the plain layers.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/moe.hpp"
#include "ringtrain/nn/tensor_group.hpp"

namespace ringtrain {

// Normalises the last dimension; weight (gamma, starts at 1) and bias (beta, 0).
class LayerNorm : public Layer {
 public:
  LayerNorm(std::string name, std::int64_t features, double eps = 1e-5);
  const char* type() const override { return "LayerNorm"; }
  bool takes_bf16() const override { return true; }
  CtxPtr make_ctx() const override;
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override;
  // Sequence parallelism: this rank normalises its tokens only, so its weight
  // and bias gradients are partial sums, summed over g in the backward.
  void sum_grads_over(const TensorGroup& g) { sum_over_ = g; }

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;

 private:
  struct Saved {
    Tensor x, y, dx;
    KernelStatePtr ks;
  };
  LayerNormSpec spec_;
  std::size_t g_ = 0, b_ = 0;
  Tensor gamma, beta, dgamma, dbeta;
  mutable Tensor partial_;  // sequence parallelism: both partial gradients, summed at once (used within a call)
  std::unique_ptr<LayerNormKernel> k_;
  TensorGroup sum_over_;
  Backend* be_ = nullptr;
};

// x [N, T, D] -> qkv projection [N, T, 3*H*hd] -> attention core -> output
// projection [N, T, D]. Parameters: "<name>.qkv.*", "<name>.proj.*".
class MultiHeadSelfAttention : public Layer {
 public:
  // heads * head_dim must equal qkv's output / 3 and proj's input.
  // causal: each token attends to itself and earlier tokens only (AttentionSpec::causal).
  MultiHeadSelfAttention(std::string name, std::int64_t heads, std::int64_t head_dim, LayerPtr qkv, LayerPtr proj,
                         bool causal = false);
  const char* type() const override { return "MultiHeadSelfAttention"; }
  // Context parallelism: the ring and all-to-all kernels run float32 activations (bf16 math: the
  // projections still multiply in bf16; the attention core in float32).
  bool takes_bf16() const override { return !cp_ && qkv_->takes_bf16() && proj_->takes_bf16(); }
  std::int64_t heads() const { return heads_; }
  CtxPtr make_ctx() const override;
  // Selective recomputation (Korthikanti et al. 2022): the forward drops the
  // attention probabilities [N, H, T, T] (the O(heads * T^2) activations) and
  // the backward recomputes them from the kept q, k, v.
  void set_recompute_core(bool on) { recompute_core_ = on; }
  // Context parallelism: the core is ring attention over g (causal only; before bind).
  void shard_context(std::shared_ptr<const ContextGroup> g);
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override;
  double forward_flops(const Shape& in) const override;

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;
  // Split backward (zero-bubble schedules): the projections' weight gradients wait for backward_weight.
  Tensor do_backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;
  void do_backward_weight(Ctx& c) const override;

 public:
  bool splits_backward() const override;

 private:
  Tensor backward_impl(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate, bool split) const;
  struct Saved {
    CtxPtr qkv, proj;
    Tensor qkv_out, core, dcore;
    KernelStatePtr ks;  // the core's (null between a forward and backward that recompute it)
  };
  std::int64_t heads_, head_dim_;
  LayerPtr qkv_, proj_;
  std::unique_ptr<AttentionKernel> k_;
  bool recompute_core_ = false;
  bool causal_ = false;
  std::shared_ptr<const ContextGroup> cp_;
};

// The standard attention: qkv and proj are Linear(dim, 3 dim) and Linear(dim, dim) with biases;
// over g, qkv is column-parallel per head and proj row-parallel (heads/T heads per rank).
LayerPtr multi_head_attention(const std::string& name, std::int64_t dim, std::int64_t heads,
                              const TensorGroup& g = {}, bool causal = false);

// Image [N, C, H, W] -> patches [N, T, C*p*p] -> Linear "proj" to [N, T, D],
// plus a learned position embedding "pos_embed" [T, D] (normal, std 0.02).
// Equal to a Conv2d(C, D, p, stride p) whose weight is proj.weight viewed as
// [D, C, p, p].
class PatchEmbed : public Layer {
 public:
  PatchEmbed(std::string name, std::int64_t channels, std::int64_t height, std::int64_t width, std::int64_t patch,
             std::int64_t dim);
  const char* type() const override { return "PatchEmbed"; }
  bool takes_bf16() const override { return proj_->takes_bf16(); }
  CtxPtr make_ctx() const override;
  std::int64_t tokens() const { return (height_ / patch_) * (width_ / patch_); }
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override;
  double forward_flops(const Shape& in) const override;

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;

 private:
  std::int64_t channels_, height_, width_, patch_, dim_;
  struct Saved {
    CtxPtr proj;
    Tensor patches, y, dx;
  };
  std::unique_ptr<Linear> proj_;
  std::size_t pos_ = 0;
  Backend* be_ = nullptr;
  Tensor pos, dpos;
};

// [N, T, D] -> [N, D]: the mean over tokens.
class TokenMean : public Layer {
 public:
  explicit TokenMean(std::string name) : Layer(std::move(name)) {}
  const char* type() const override { return "TokenMean"; }
  bool takes_bf16() const override { return true; }
  CtxPtr make_ctx() const override;
  void bind(const BindContext& ctx) override { be_ = &ctx.backend; }
  Shape output_shape(const Shape& in) const override;

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;

 private:
  struct Saved {
    Tensor y, dx;
  };
  Backend* be_ = nullptr;
};

// x_{i+1} = x_i + branch_i(x_i) for each branch in turn: a pre-norm
// transformer block is two branches, [LayerNorm, attention] and [LayerNorm,
// Linear, GELU, Linear]. Children are named "<prefix><name>.<child>" (no
// level for the branches), reported ready once after all of them.
// Sequence parallelism over g (g.size > 1): the residual stream is this
// rank's token shard. scatter_in: the input is whole (replicated) and the
// stack takes its tokens (backward: all-gathers dx); gather_out: the output is
// all-gathered whole (backward: takes this rank's tokens of the replicated dy).
// A run of blocks passes shards between them: the first scatters, the last gathers.
struct SequenceShard {
  TensorGroup g;  // size 1: off
  bool scatter_in = false, gather_out = false;
};

class ResidualStack : public Layer {
 public:
  ResidualStack(std::string name, std::vector<std::vector<LayerPtr>> branches, SequenceShard seq = {});
  const char* type() const override { return "ResidualStack"; }
  // When every child does; token shards are sliced and gathered in either type.
  bool takes_bf16() const override;
  CtxPtr make_ctx() const override;
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override;
  std::vector<NamedBuffer> buffers() const override;
  double forward_flops(const Shape& in) const override;
  void for_each_child(const std::function<void(Layer&)>& f) override;

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;
  // Split backward (zero-bubble schedules): the branches' deferred weight gradients wait for backward_weight.
  Tensor do_backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;
  void do_backward_weight(Ctx& c) const override;

 public:
  bool splits_backward() const override;

 private:
  Tensor backward_impl(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate, bool split) const;
  struct Saved {
    std::vector<std::vector<CtxPtr>> branches;
    std::vector<Tensor> sums;  // x_1 .. x_k (branch i+1 keeps x_i as its input)
    Tensor dx;
    std::vector<Tensor> dxs;  // split backward: each branch's sum (a branch that defers keeps its dy)
    Tensor xs, y, dys, dxw;  // sequence: input shard, whole output, dy shard, whole dx
  };
  std::vector<std::vector<LayerPtr>> branches_;
  SequenceShard seq_;
  Backend* be_ = nullptr;
};

struct TransformerBlockSpec {
  std::int64_t dim = 0, heads = 1;
  double mlp_ratio = 4.0;  // hidden = round(dim * mlp_ratio)
  double dropout = 0.0;    // after the attention projection and after fc2 (0: none)
  // Sequence parallelism (g.size > 1): norms, dropouts and the residual
  // stream on 1/T of the tokens; seq_first / seq_last: the block starts / ends
  // a run of such blocks (takes whole tokens in / gives them out).
  bool sequence = false, seq_first = true, seq_last = true;
  bool causal = false;     // causal attention (a language model's block)
  Eltwise gelu = Eltwise::gelu;  // the MLP's activation: erf (default) or tanh (GPT-2)
  double eps = 1e-5;             // both LayerNorms' epsilon
  // moe.experts > 0: the MLP is a mixture of experts (nn/moe.hpp; dim, hidden and gelu are the block's).
  MoeSpec moe;
  ExpertGroup expert;
};
// Pre-norm block "<name>": norm1, attn (qkv, proj), norm2, fc1, GELU, fc2. Over g
// the attention splits its heads and the MLP is fc1 column-parallel, fc2
// row-parallel; LayerNorms, the row biases and the dropouts (outside the
// parallel regions: the same stream on every tensor rank) are replicated.
// With s.sequence they run on this rank's tokens (Korthikanti et al. 2022):
// each all-reduce becomes an all-gather before the column layer and a
// reduce-scatter after the row layer, the replicated gradients are summed.
LayerPtr transformer_block(const std::string& name, const TransformerBlockSpec& s, const TensorGroup& g = {});

}  // namespace ringtrain
