#pragma once
// The concrete layers. Each checks its input once per forward and dispatches
// to the kernel its device's backend created in bind(). Shapes are NCHW for
// images and [N, features] for Linear; a Flatten sits between them.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/nn/layer.hpp"
#include "ringtrain/nn/tensor_group.hpp"

namespace ringtrain {

struct ContextGroup;  // nn/context_parallel.hpp

// Linear and Conv2d: a weight [out, in, ...] and an optional bias [out], and
// a backward that splits into an input half and a weight half where the
// backend's kernels accept an undefined dw (Backend::splits_weight_grad).
// Initial weights use PyTorch's fans: fan_in = numel / out, fan_out = numel / in.
class WeightLayer : public Layer {
 public:
  const Shape& weight_shape() const { return wshape_; }  // [out, in] or [out, in, kh, kw]
  bool has_bias() const { return bias_; }
  DType weight_dtype() const { return dtype_; }
  Init init_kind() const { return init_; }
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  bool splits_backward() const override { return split_; }
  CtxPtr make_ctx() const override { return ctx_of<Saved>(); }
  // The next forward with c writes its output into y, the next backward its
  // input gradient into dx, when the shapes fit: views of shared workspaces for the
  // tensors a collective consumes at once (sequence parallelism, parallel_layers.cpp).
  void write_output_into(Ctx& c, const Tensor& y) const { saved<Saved>(c).y = y; }
  void write_input_grad_into(Ctx& c, const Tensor& dx) const { saved<Saved>(c).dx = dx; }

 protected:
  struct Saved {
    Tensor x, y, dx;
    Tensor dy;  // kept from backward_input for backward_weight
    bool w_pending = false;  // backward_input ran; backward_weight owes dw (and db)
    bool w_accumulate = false;
    KernelStatePtr ks;  // the kernel's forward-to-backward state
  };
  WeightLayer(std::string name, Shape weight, bool bias, DType dt, Init init);
  // The parameter views and whether the backend splits; call from bind().
  void bind_weights(const BindContext& ctx);
  // One kernel backward over the forward's s.x and s.y: returns dx when need_dx
  // (undefined otherwise) and writes dw, db when `weights`.
  virtual Tensor run_backward(const Tensor& dy, Saved& s, bool need_dx, bool weights, bool accumulate) const = 0;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override {
    return run_backward(dy, saved<Saved>(c), need_dx, true, accumulate);
  }
  Tensor do_backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;
  void do_backward_weight(Ctx& c) const override;

  Init init_;
  DType dtype_;
  Tensor w, b, dw, db;  // views of the arena

 private:
  Shape wshape_;
  bool bias_;
  std::size_t w_ = 0, b_ = 0;
  bool split_ = false;      // the backend's kernels accept an undefined dw
};

class Linear : public WeightLayer {
 public:
  Linear(std::string name, LinearSpec spec, Init init = Init::kaiming_normal);
  const char* type() const override { return spec_.fuse_relu ? "Linear+ReLU" : "Linear"; }
  const LinearSpec& spec() const { return spec_; }
  void bind(const BindContext& ctx) override;
  Shape output_shape(const Shape& in) const override;
  double forward_flops(const Shape& in) const override;
  bool takes_bf16() const override { return spec_.dtype == DType::f32; }

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor run_backward(const Tensor& dy, Saved& s, bool need_dx, bool weights, bool accumulate) const override;

 private:
  Tensor rows_of(const Tensor& t, std::int64_t features) const;
  // The weight the kernel multiplies by for activations of type dt: w itself,
  // or (bfloat16) a copy cast from w when the arena's version moved on.
  const Tensor& weight_for(DType dt) const;
  LinearSpec spec_;
  std::unique_ptr<LinearKernel> k_;
  Backend* be_ = nullptr;
  const ParamArena* arena_ = nullptr;
  WeightCopy w16_;
};

class Conv2d : public WeightLayer {
 public:
  Conv2d(std::string name, Conv2dSpec spec, Init init = Init::kaiming_normal);
  const char* type() const override;
  const Conv2dSpec& spec() const { return spec_; }
  void bind(const BindContext& ctx) override;
  Shape output_shape(const Shape& in) const override;
  double forward_flops(const Shape& in) const override;
  bool takes_bf16() const override { return spec_.dtype == DType::f32 && be_ && be_->bf16_images(); }

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor run_backward(const Tensor& dy, Saved& s, bool need_dx, bool weights, bool accumulate) const override;

 private:
  Shape conv_shape(const Shape& in) const;  // before the fused pooling
  // As Linear's: w, or for bfloat16 activations a copy cast from w once per arena version.
  const Tensor& weight_for(DType dt) const;
  Conv2dSpec spec_;
  std::unique_ptr<Conv2dKernel> k_;
  Backend* be_ = nullptr;
  const ParamArena* arena_ = nullptr;
  WeightCopy w16_;
};

class BatchNorm2d : public Layer {
 public:
  BatchNorm2d(std::string name, BatchNormSpec spec);
  const char* type() const override { return "BatchNorm2d"; }
  // bf16 data, float32 statistics
  bool takes_bf16() const override { return spec_.dtype == DType::f32 && be_ && be_->bf16_images(); }
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override;
  std::vector<NamedBuffer> buffers() const override;  // running_mean, running_var
  CtxPtr make_ctx() const override { return ctx_of<Saved>(); }

  // Deferred running statistics (torchgpipe's DeferredBatchNorm), for the
  // micro-batches of a pipeline step: while on, a train-mode forward still
  // normalises with its own batch's statistics but leaves running_mean/var
  // alone and accumulates the batch's count, mean and sum of squared deviations
  // (in double, merged with Chan et al.'s formula); commit_deferred_stats()
  // then updates the running statistics ONCE with the mean and unbiased
  // variance of everything accumulated since the last commit (momentum as
  // usual), which equals one forward over the concatenated batch. Eval-mode
  // forwards are unaffected. Turning it off drops what was not committed.
  void set_deferred_stats(bool on);
  bool deferred_stats() const { return deferred_ != nullptr; }
  void commit_deferred_stats();  // no-op when nothing was accumulated

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;

 private:
  struct Saved {
    Tensor x, y, dx;
    BatchNormKernel* k = nullptr;  // ran the forward: its saved statistics serve the backward
    KernelStatePtr ks;
  };
  struct DeferredStats {
    double count = 0;
    std::vector<double> mean, m2;  // per channel: mean, sum of squared deviations
  };
  void run_batch_kernel(const Tensor& x, Saved& s) const;  // the momentum-1 kernel: s.y and the batch's statistics
  void accumulate_batch_stats(const Tensor& x, Saved& s) const;

  BatchNormSpec spec_;
  std::string prefix_;
  std::size_t g_ = 0, b_ = 0;
  Tensor gamma, beta, dgamma, dbeta;
  // Not micro-batch state: the running statistics, which every train-mode
  // forward updates (a buffer checkpoints keep), and the caches below.
  mutable Tensor running_mean, running_var;
  std::unique_ptr<BatchNormKernel> k_;
  Backend* be_ = nullptr;
  std::shared_ptr<DeferredStats> deferred_;  // null: running statistics updated per forward
  // Deferred mode: a momentum-1 kernel writes the batch's mean / unbiased
  // variance into these instead of blending them into the running statistics.
  mutable std::unique_ptr<BatchNormKernel> k_batch_;
  mutable Tensor batch_mean_, batch_var_;
  mutable Tensor saved_mean_, saved_var_;  // the running statistics across a replay
};

// ReLU or GELU as its own layer (Conv2d/Linear can also fuse ReLU).
class Activation : public Layer {
 public:
  Activation(std::string name, Eltwise op) : Layer(std::move(name)), op_(op) {}
  const char* type() const override { return op_ == Eltwise::relu ? "ReLU" : "GELU"; }
  bool takes_bf16() const override { return true; }
  void bind(const BindContext& ctx) override;
  Shape output_shape(const Shape& in) const override { return in; }
  CtxPtr make_ctx() const override { return ctx_of<Saved>(); }

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;

 private:
  struct Saved {
    Tensor x, y, dx;
  };
  Eltwise op_;
  std::unique_ptr<EltwiseKernel> k_;
};

// The [N, C, OH, OW] that pooling [N, C, H, W] gives (OH or OW <= 0: the kernel does not fit).
Shape pool2d_output(const Shape& in, const Pool2dSpec& s);

// MaxPool2d / AvgPool2d; global_avg=true pools the whole H x W (kernel set per input).
class Pool2d : public Layer {
 public:
  Pool2d(std::string name, Pool2dSpec spec, bool global_avg = false);
  const char* type() const override;
  void bind(const BindContext& ctx) override;
  Shape output_shape(const Shape& in) const override;
  CtxPtr make_ctx() const override { return ctx_of<Saved>(); }
  bool takes_bf16() const override { return be_ && be_->bf16_images(); }

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;

 private:
  struct Saved {
    Tensor x, y, dx;
    Pool2dKernel* k = nullptr;  // ran the forward (global pooling: the kernel of its shape)
    KernelStatePtr ks;
  };
  Pool2dKernel& kernel_for(const Shape& in) const;
  Pool2dSpec spec_;
  bool global_;
  Backend* be_ = nullptr;
  std::unique_ptr<Pool2dKernel> k_;
  // Global pooling: a kernel per input size, made on first use (a cache, not state).
  mutable std::map<std::pair<std::int64_t, std::int64_t>, std::unique_ptr<Pool2dKernel>> global_k_;
};

// Inverted dropout, deterministic: the mask depends on (model seed, layer
// stream, optimizer step, global element index) only, where an element's index
// counts from the first sample of the step's global batch (Call::position),
// so every layout draws the 1-rank run's mask for a sample. Without a position
// (a layer bound on its own) the forward call count stands in for the step and the
// local element index for the global one. Identity in eval mode.
class Dropout : public Layer {
 public:
  Dropout(std::string name, double p);
  const char* type() const override { return "Dropout"; }
  bool takes_bf16() const override { return true; }  // a feature shard too (its host loop keeps bf16)
  void bind(const BindContext& ctx) override;
  Shape output_shape(const Shape& in) const override { return in; }
  double p() const { return p_; }
  // Next train-mode forward uses this call index (checkpoint resume).
  void set_call_count(std::uint64_t n) { calls_ = n; }
  std::uint64_t call_count() const { return calls_; }
  CtxPtr make_ctx() const override { return ctx_of<Saved>(); }
  // Tensor parallelism: the input is part `index` of `parts` of a wider
  // activation along its last dimension; the mask is then that part of the
  // whole activation's mask (the 1-rank model's), computed on the host.
  void shard_features(int parts, int index) { parts_ = parts, index_ = index; }
  // Sequence parallelism: the input [N, T, ...] is part `index` of `parts` of
  // the tokens; the mask is that part of the whole activation's.
  void shard_tokens(int parts, int index) { token_parts_ = parts, index_ = index; }
  // Context parallelism: the input is this rank's head-tail tokens
  // (nn/context_parallel.hpp); the mask is theirs of the whole activation's.
  void shard_context(std::shared_ptr<const ContextGroup> g) { cp_ = std::move(g); }

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;

 private:
  struct Saved {
    Tensor mask, y, dx;
    bool identity = true;  // the forward was eval (or p == 0)
  };
  double p_;
  Backend* be_ = nullptr;
  std::uint64_t seed_ = 0, stream_ = 0;
  // Forwards without a position count their calls (a layer run on its own):
  // a run-wide counter, not micro-batch state.
  mutable std::uint64_t calls_ = 0;
  int parts_ = 1, token_parts_ = 1, index_ = 0;
  std::shared_ptr<const ContextGroup> cp_;
  Tensor forward_context(const Tensor& x, Saved& s, std::uint64_t stream, std::int64_t first_sample) const;
};

// [N, ...] -> [N, prod(...)]: a view, no copy.
class Flatten : public Layer {
 public:
  explicit Flatten(std::string name) : Layer(std::move(name)) {}
  const char* type() const override { return "Flatten"; }
  bool takes_bf16() const override { return true; }  // a view of any type
  Shape output_shape(const Shape& in) const override;
  CtxPtr make_ctx() const override { return std::make_unique<Ctx>(); }  // nothing beyond the input shape

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;
};

// Children run in order; parameters are named "<prefix><name>.<child>...".
class Sequential : public Layer {
 public:
  Sequential(std::string name, std::vector<LayerPtr> children);
  const char* type() const override { return "Sequential"; }
  bool takes_bf16() const override;  // when every child does
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override;
  std::vector<NamedBuffer> buffers() const override;
  double forward_flops(const Shape& in) const override;
  const std::vector<LayerPtr>& children() const { return children_; }
  bool splits_backward() const override;
  void for_each_child(const std::function<void(Layer&)>& f) override;
  CtxPtr make_ctx() const override;

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;
  Tensor do_backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;
  void do_backward_weight(Ctx& c) const override;

 private:
  struct Saved {
    std::vector<CtxPtr> children;
  };
  std::vector<LayerPtr> children_;
};

// y = post(body(x) + shortcut(x)); an empty shortcut is the identity and post
// is an optional ReLU: the ResNet BasicBlock. The residual Add lives here.
class Residual : public Layer {
 public:
  Residual(std::string name, std::vector<LayerPtr> body, std::vector<LayerPtr> shortcut, bool relu_after = true);
  const char* type() const override { return "Residual"; }
  bool takes_bf16() const override;  // when every child does (the add and ReLU take bf16)
  CtxPtr make_ctx() const override;
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override;
  std::vector<NamedBuffer> buffers() const override;
  double forward_flops(const Shape& in) const override;
  bool splits_backward() const override;
  void for_each_child(const std::function<void(Layer&)>& f) override;

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;
  Tensor do_backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;
  void do_backward_weight(Ctx& c) const override;

 private:
  struct Saved {
    std::vector<CtxPtr> body, shortcut;
    CtxPtr post;
    Tensor sum, dx;
  };
  std::vector<LayerPtr> body_;
  std::vector<LayerPtr> shortcut_;     // empty = identity
  std::unique_ptr<Activation> post_;   // null = none
  Backend* be_ = nullptr;
};

// ResNet BasicBlock: conv3x3(stride)-BN-ReLU-conv3x3-BN (+ 1x1 conv-BN shortcut
// when the shape changes), add, ReLU; `resnet`'s block (models.cpp). Over g
// the first conv is column-parallel, bn1 channel-split and the second conv
// row-parallel (one all-reduce each way); size 1 builds the plain block.
LayerPtr basic_block(const std::string& name, std::int64_t in_ch, std::int64_t out_ch, std::int64_t stride,
                     const TensorGroup& g = {});

}  // namespace ringtrain
