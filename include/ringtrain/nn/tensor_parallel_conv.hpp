#pragma once
// Tensor parallelism for convolutional models: Megatron's column/row split
// (nn/tensor_parallel.hpp) applied to the channel dimension.
//  - ColumnParallelConv2d: out/T filters per rank (weight rows and bias split),
//    f on its input (dx all-reduced in backward). A fused ReLU / pooling is
//    per channel, so it stays local.
//  - ChannelParallelBatchNorm2d: BatchNorm over this rank's channels of a
//    channel-split activation. Statistics are per channel over the whole
//    (unsplit) batch, so they equal the 1-rank model's; gamma, beta and the
//    running statistics are shards (ShardSpec on the parameters and buffers).
//  - RowParallelConv2d: in/T input channels per rank; the partial outputs are
//    all-reduced (g), then the replicated bias, the ReLU and the pooling of the
//    spec run once, after the reduction.
// conv(column) -> [BN, ReLU, pooling] -> conv(row) costs one all-reduce
// forward and one backward, like an MLP pair. Same rules as the Linear layers:
// parameters are the local shards marked in the arena, initial values are the
// 1-rank model's (whole weight's RNG stream, then the rank's part), CPU only.
#include <memory>
#include <string>

#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/nn/tensor_group.hpp"

namespace ringtrain {

// spec: the WHOLE convolution (in -> out channels).
class ColumnParallelConv2d : public Layer {
 public:
  ColumnParallelConv2d(std::string name, Conv2dSpec spec, Init init, TensorGroup g);
  const char* type() const override { return "ColumnParallelConv2d"; }
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override { return local_->output_shape(in); }
  double forward_flops(const Shape& in) const override { return local_->forward_flops(in); }

 protected:
  Tensor do_forward(const Tensor& x, Mode mode) override { return local_->forward(x, mode); }
  Tensor do_backward(const Tensor& dy, bool need_dx, bool accumulate) override;

 private:
  Conv2dSpec spec_;
  Init init_;
  TensorGroup g_;
  std::unique_ptr<Conv2d> local_;  // in -> out/T, same name: "<name>.weight", "<name>.bias"
};

class RowParallelConv2d : public Layer {
 public:
  RowParallelConv2d(std::string name, Conv2dSpec spec, Init init, TensorGroup g);
  const char* type() const override { return "RowParallelConv2d"; }
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override;
  double forward_flops(const Shape& in) const override { return local_->forward_flops(in); }

 protected:
  Tensor do_forward(const Tensor& x, Mode mode) override;
  Tensor do_backward(const Tensor& dy, bool need_dx, bool accumulate) override;

 private:
  Conv2dSpec spec_;
  Init init_;
  TensorGroup g_;
  std::unique_ptr<Conv2d> local_;  // in/T -> out, no bias, nothing fused
  std::unique_ptr<Pool2dKernel> pool_;
  std::size_t b_ = 0;
  Tensor b, db, z_, y_, dz_;  // z_: reduced conv (+ bias, ReLU) before the pooling
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

// The tensor-parallel variants of the model zoo's convolutional models
// (models.cpp builds the rest): errors name the key or layer T does not divide.
std::vector<LayerPtr> tensor_parallel_cnn(const ModelConfig& c, bool fuse_pool);
LayerPtr tensor_parallel_basic_block(const std::string& name, std::int64_t in_ch, std::int64_t out_ch,
                                     std::int64_t stride, const TensorGroup& g);

}  // namespace ringtrain
