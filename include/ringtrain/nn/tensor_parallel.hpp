#pragma once
// Tensor (intra-layer) parallelism after Megatron-LM (Shoeybi et al. 2019).
// A TensorGroup is the tensor-parallel communicator of the process grid; the
// layers here split one Linear across its ranks:
//  - f ("copy to region"):   identity forward, all-reduce (sum) backward.
//  - g ("reduce from region"): all-reduce (sum) forward, identity backward.
//  - gather / split along the last (feature) dimension, adjoint of each other.
//  - ColumnParallelLinear: weight rows split, each rank computes out/T
//    features of the output; f on its input (dx all-reduced in backward).
//  - RowParallelLinear: input features split; each rank's partial product is
//    all-reduced (g), then the replicated bias (and an optional ReLU) is applied
//    once, after the reduction.
// An MLP column -> GELU -> row and attention with qkv column-parallel (per
// head) and proj row-parallel cost one all-reduce forward and one backward
// each: two per transformer block in each direction.
//
// Rules: parameters are the local shards, marked in the arena (ShardSpec) so
// clipping, checkpoints and broadcasts know what is sharded. Initial values
// are the 1-rank model's (same counter-RNG stream for the whole weight, then
// the rank's part), so tensor = T starts where tensor = 1 starts. The
// collectives are ringtrain's own (comm/collectives.hpp): all-reduces of device
// tensors go through the device collectives, gathers and splits through host
// memory. (The CUDA path is compiled and reviewed; it has not run on a GPU yet.)
#include <cstdint>
#include <string>

#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/tensor_group.hpp"
#include "ringtrain/nn/transformer.hpp"

namespace ringtrain {

// ---- the conjugate operators and feature-dimension gather/split (in place where possible) ----
void tp_all_reduce(Tensor& t, const TensorGroup& g);                       // sum over the group, in place
void tp_gather_last(const Tensor& local, Tensor& whole, const TensorGroup& g);  // [..., d] -> [..., d*T]
void tp_split_last(const Tensor& whole, Tensor& local, const TensorGroup& g);   // [..., d*T] -> rank's [..., d]

// ---- shards of whole tensors (host) ----
// This rank's part of `whole` as `s` describes it (s.global == whole.shape()).
Tensor shard_of(const Tensor& whole, const ShardSpec& s);
// Writes `local` (part s.index) into its place in `whole`.
void place_shard(const Tensor& local, const ShardSpec& s, Tensor& whole);
// The whole tensor from every rank's part (collective over g; s is this rank's spec).
Tensor gather_whole(const Tensor& local, const ShardSpec& s, const TensorGroup& g);
// Split of `global` into `parts` along `dim` for part `index`.
ShardSpec make_shard(const Shape& global, int dim, int parts, int index, int blocks = 1);

namespace detail {
// The backward of a column-parallel layer around its local part: dx (a partial
// sum of the replicated input's gradient) is all-reduced over g on a helper
// thread while `local` computes its weight gradient (async dgrad all-reduce).
Tensor column_parallel_backward(Layer& local, const Tensor& dy, bool need_dx, bool accumulate, const TensorGroup& g);
}  // namespace detail

// f and g as layers (for building blocks by hand; the parallel Linears call the functions).
class CopyToTensorRegion : public Layer {  // f
 public:
  CopyToTensorRegion(std::string name, TensorGroup g) : Layer(std::move(name)), g_(std::move(g)) {}
  const char* type() const override { return "CopyToTensorRegion"; }
  Shape output_shape(const Shape& in) const override { return in; }

 protected:
  Tensor do_forward(const Tensor& x, Mode) override { return x; }
  Tensor do_backward(const Tensor& dy, bool need_dx, bool) override;

 private:
  TensorGroup g_;
  Tensor dx_;
};

class ReduceFromTensorRegion : public Layer {  // g
 public:
  ReduceFromTensorRegion(std::string name, TensorGroup g) : Layer(std::move(name)), g_(std::move(g)) {}
  const char* type() const override { return "ReduceFromTensorRegion"; }
  Shape output_shape(const Shape& in) const override { return in; }

 protected:
  Tensor do_forward(const Tensor& x, Mode) override;
  Tensor do_backward(const Tensor& dy, bool, bool) override { return dy; }

 private:
  TensorGroup g_;
  Tensor y_;
};

// spec: the WHOLE layer (in -> out); blocks: out is `blocks` equal parts split
// separately (3 for a fused qkv projection, so heads stay whole on a rank).
class ColumnParallelLinear : public Layer {
 public:
  ColumnParallelLinear(std::string name, LinearSpec spec, Init init, TensorGroup g, int blocks = 1);
  const char* type() const override { return "ColumnParallelLinear"; }
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override { return local_->output_shape(in); }
  double forward_flops(const Shape& in) const override { return local_->forward_flops(in); }

 protected:
  Tensor do_forward(const Tensor& x, Mode mode) override { return local_->forward(x, mode); }
  Tensor do_backward(const Tensor& dy, bool need_dx, bool accumulate) override;

 private:
  LinearSpec spec_;
  Init init_;
  TensorGroup g_;
  int blocks_;
  std::unique_ptr<Linear> local_;  // in -> out/T, same name: parameters "<name>.weight", "<name>.bias"
};

class RowParallelLinear : public Layer {
 public:
  RowParallelLinear(std::string name, LinearSpec spec, Init init, TensorGroup g);
  const char* type() const override { return spec_.fuse_relu ? "RowParallelLinear+ReLU" : "RowParallelLinear"; }
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override { return local_->output_shape(in); }
  double forward_flops(const Shape& in) const override { return local_->forward_flops(in); }

 protected:
  Tensor do_forward(const Tensor& x, Mode mode) override;
  Tensor do_backward(const Tensor& dy, bool need_dx, bool accumulate) override;

 private:
  LinearSpec spec_;
  Init init_;
  TensorGroup g_;
  std::unique_ptr<Linear> local_;  // in/T -> out without bias
  std::size_t b_ = 0;
  Backend* be_ = nullptr;
  Tensor b, db, y_, dy_;
};

// The pre-norm transformer block (transformer_block) split over g: attention
// with heads/T local heads (qkv column-parallel per head, proj row-parallel),
// MLP fc1 column-parallel -> GELU -> fc2 row-parallel. LayerNorms, the row
// biases and the dropouts (outside the parallel regions: the same stream on
// every tensor rank) are replicated. Errors name model.heads / model.mlp_ratio.
LayerPtr tensor_parallel_block(const std::string& name, const TransformerBlockSpec& s, const TensorGroup& g);

// Divisibility checks with errors naming the configuration key and values.
void check_tensor_divides(std::int64_t value, const char* key, const TensorGroup& g, const char* model);

}  // namespace ringtrain
