#pragma once
// Tensor (intra-layer) parallelism after Megatron-LM (Shoeybi et al. 2019).
// A TensorGroup is the tensor-parallel communicator of the process grid; the
// layers here split one Linear or Conv2d across its ranks:
//  - f ("copy to region"):   identity forward, all-reduce (sum) backward.
//  - g ("reduce from region"): all-reduce (sum) forward, identity backward.
//  - ColumnParallel: each rank keeps out/T outputs (weight rows, bias split
//    with them); f on its input (dx all-reduced in backward). A fused ReLU or
//    pooling is per output, so it stays local.
//  - RowParallel: each rank takes in/T inputs (features, or channels of a
//    column-split activation); the partial products are all-reduced (g), then
//    the replicated bias, the ReLU and the pooling of the spec run once, after
//    the reduction, as Backend operations (so on the tensors' device).
//  - ChannelParallelBatchNorm2d: BatchNorm over this rank's channels of a
//    channel-split activation; statistics are per channel over the whole
//    batch, so they equal the unsplit layer's.
// column -> [per-feature layers] -> row costs one all-reduce forward and one
// backward: an MLP pair, conv pair, or attention with qkv column-parallel (per
// head) and proj row-parallel; two per transformer block in each direction.
//
// Rules: parameters are the local shards, marked in the arena (ShardSpec) so
// clipping, checkpoints and broadcasts know what is sharded; they keep the
// unsplit layer's names and registration order. Initial values are the
// unsplit layer's (the same counter-RNG stream for the whole weight, then the
// rank's part), so tensor = T starts where tensor = 1 starts. The collectives
// are ringtrain's own (comm/collectives.hpp): all-reduces of device tensors go
// through the device collectives.
//
// bfloat16 activations (train.precision = bf16, Layer::takes_bf16): a column
// or row layer takes bf16 when its local Linear does (a bf16 copy of the
// local fp32 weight shard, fp32 gradients, fp32 accumulation in the matmul).
// Sums over the group run in float32 (tp_sum_f32): a row layer's bf16 partial
// products are widened, summed, the bias added, and rounded to bf16 once; the
// all-gathers, which do no arithmetic, move bf16.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/tensor_group.hpp"

namespace ringtrain {

// f's backward and g's forward: the sum over the group, in place (f's forward
// and g's backward are the identity).
void tp_all_reduce(Tensor& t, const TensorGroup& g);
// out = the sum over the group of `in` (out may be `in`; same shape): no copy before the reduction.
// bfloat16: summed in float32 and rounded once (tp_sum_f32).
void tp_all_reduce(const Tensor& in, Tensor& out, const TensorGroup& g);
// The float32 sum over the group of `in` (any float type), or with
// scatter_tokens this rank's tokens of it (seq_reduce_scatter's result), in
// g's workspaces sum_whole and sum_shard (tensor_group.hpp): valid until the next call.
// Why float32 on the wire for bfloat16 sums: the collectives' ring rounds each
// partial sum to bf16 at every one of its T - 1 combine steps, so at T > 2 a
// bf16 sum would carry T - 1 roundings in an order set by the ring; the 1-rank
// layer rounds its float32-accumulated sum once. Converting first costs twice
// the bytes of a bf16 sum over the (node-local) tensor group, and gives one
// float32 sum rounded once by the caller.
Tensor tp_sum_f32(const Tensor& in, const TensorGroup& g, bool scatter_tokens);

// ---- sequence parallelism (Korthikanti et al. 2022) ----
// Tokens [B, S, ...] split along S: rank r holds tokens [r S/T, (r+1) S/T) of
// every sample, a strided part of the batch-outer tensor, so the collectives
// pack / unpack through a host scratch (rank-major [T][B][S/T][...]).
// Megatron's g-bar forward (the all-gather before a column layer; its
// backward is the reduce-scatter) and g forward (the reduce-scatter after a
// row layer; its backward the all-gather).
// bfloat16: the all-gather moves bf16; the reduce-scatter sums in float32 (tp_sum_f32).
void seq_all_gather(const Tensor& shard, Tensor& whole, const TensorGroup& g);
void seq_reduce_scatter(const Tensor& whole, Tensor& shard, const TensorGroup& g);
// This rank's tokens of a replicated `whole` (a copy, no communication).
void seq_slice(const Tensor& whole, Tensor& shard, const TensorGroup& g);
// The token shape on either side: dim 1 multiplied / divided by g.size
// (an Error naming parallel.sequence and parallel.tensor if it does not divide).
Shape seq_whole_shape(const Shape& shard, const TensorGroup& g);
Shape seq_shard_shape(const Shape& whole, const TensorGroup& g);
// Gradients of a replicated parameter computed on this rank's tokens
// (LayerNorm, the row layer's bias): `partial` (overwritten, the grads'
// sizes end to end) is summed over the group, then written (accumulate:
// added) into each of `grads`, so every rank holds the whole gradient.
void tp_sum_partial(Tensor& partial, const std::vector<Tensor>& grads, bool accumulate, const TensorGroup& g,
                    Backend& be);

// ---- shards of whole tensors (host) ----
// This rank's part of `whole` as `s` describes it (s.global == whole.shape()).
Tensor shard_of(const Tensor& whole, const ShardSpec& s);
// Writes `local` (part s.index) into its place in `whole`.
void place_shard(const Tensor& local, const ShardSpec& s, Tensor& whole);
// The whole tensor from every rank's part (collective over g; s is this rank's spec).
Tensor gather_whole(const Tensor& local, const ShardSpec& s, const TensorGroup& g);
// Split of `global` into `parts` along `dim` for part `index`.
ShardSpec make_shard(const Shape& global, int dim, int parts, int index, int blocks = 1);

// What ColumnParallel and RowParallel share: this rank's part of one Linear
// or Conv2d (`local_`, an ordinary layer of the local sizes under the whole
// layer's name, so its parameters keep the whole layer's names), its weight
// marked as part `g.rank` of the whole along `dim` (0: outputs, 1: inputs),
// and initial values that are that part of the whole weight's.
class TensorParallelLayer : public Layer {
 public:
  const char* type() const override { return type_; }
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override { return local_->output_shape(in); }
  double forward_flops(const Shape& in) const override { return local_->forward_flops(in); }
  bool takes_bf16() const override { return local_->takes_bf16(); }

 protected:
  TensorParallelLayer(std::string name, const char* type, std::unique_ptr<WeightLayer> local, int dim,
                      TensorGroup g, int blocks);
  const char* type_;
  std::unique_ptr<WeightLayer> local_;
  int dim_, blocks_;
  TensorGroup g_;
  Shape whole_;  // the whole weight's shape
};

// spec: the WHOLE layer. blocks: its outputs are `blocks` equal parts split
// separately (3 for a fused qkv projection, so heads stay whole on a rank).
class ColumnParallel : public TensorParallelLayer {
 public:
  ColumnParallel(std::string name, const LinearSpec& spec, Init init, TensorGroup g, int blocks = 1);
  ColumnParallel(std::string name, const Conv2dSpec& spec, Init init, TensorGroup g, int blocks = 1);
  // g.sequence: the input is a token shard, all-gathered first (its dx reduce-scattered).
  Shape output_shape(const Shape& in) const override { return local_->output_shape(gathered(in)); }
  double forward_flops(const Shape& in) const override { return local_->forward_flops(gathered(in)); }
  CtxPtr make_ctx() const override;

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;

 private:
  struct Saved {
    CtxPtr local;
    Tensor xs, xg;  // sequence: the input shard, the gathered input (a workspace view)
  };
  Shape gathered(const Shape& in) const;
  // A group built by hand (not by TensorGroup::of) gets a helper thread on first use.
  mutable std::shared_ptr<TaskThread> own_helper_;
};

class RowParallel : public TensorParallelLayer {
 public:
  RowParallel(std::string name, const LinearSpec& spec, Init init, TensorGroup g);
  RowParallel(std::string name, const Conv2dSpec& spec, Init init, TensorGroup g);
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override;
  CtxPtr make_ctx() const override;
  // A row Conv2d that pools after the reduction keeps its stage in float32.
  bool takes_bf16() const override { return local_->takes_bf16() && !after_.pool; }

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;

 private:
  struct Saved {
    CtxPtr local;
    Tensor z, y, dz;  // z: the reduced output (+ bias, ReLU) before the pooling
    Tensor dbp;       // sequence: this rank's part of db
    KernelStatePtr pool;
  };
  // What runs after the reduction (the local layer has none of it).
  struct After {
    bool bias = false, relu = false, pool = false;
    bool images = false;  // NCHW: the bias is per channel over H*W (else over the last dimension)
    Pool2dSpec pool_spec;
  };
  RowParallel(std::string name, const char* type, std::unique_ptr<WeightLayer> local, TensorGroup g, After after);
  std::int64_t inner(const Tensor& z) const;  // elements per bias entry: 1, or H*W of images

  After after_;
  std::size_t b_ = 0;
  Backend* be_ = nullptr;
  std::unique_ptr<EltwiseKernel> relu_;
  std::unique_ptr<Pool2dKernel> pool_;
  Tensor b, db;
};

// channels: the WHOLE layer's; this rank normalises channels/T of them.
class ChannelParallelBatchNorm2d : public BatchNorm2d {
 public:
  ChannelParallelBatchNorm2d(std::string name, BatchNormSpec whole, TensorGroup g);
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  std::vector<NamedBuffer> buffers() const override;

 private:
  std::int64_t channels_;  // whole
  TensorGroup g_;
};

// A model's tensor-parallel plan for one layer: replicated on every tensor
// rank, or split by output (column) or input (row).
enum class TensorSplit { none, column, row };

// The layer `spec` describes (the WHOLE layer) as this rank builds it: the
// plain Linear / Conv2d when split is none or g.size == 1 (a split over one
// rank is the layer itself), else its ColumnParallel / RowParallel part.
LayerPtr split_layer(std::string name, const LinearSpec& spec, Init init, TensorSplit split, const TensorGroup& g,
                     int blocks = 1);
LayerPtr split_layer(std::string name, const Conv2dSpec& spec, Init init, TensorSplit split, const TensorGroup& g,
                     int blocks = 1);

// Divisibility checks with errors naming the configuration key and values.
void check_tensor_divides(std::int64_t value, const char* key, const TensorGroup& g, const char* model);

}  // namespace ringtrain
