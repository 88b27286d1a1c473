#pragma once
// Layer: the unit of forward/backward and of gradient readiness.
//
// Rules:
//  - Life cycle: construct -> register_params(arena) (construction order is the
//    arena order) -> arena.finalize(device) -> bind(ctx) -> init(seed) ->
//    forward/backward pairs. A Stage (parallel/stage.hpp) drives all of it.
//  - forward()/backward() are non-virtual: they check the input shape against
//    the layer (error names the layer) and then dispatch to do_forward /
//    do_backward, which call the device's kernels (nn/backend.hpp).
//  - Per-micro-batch state lives in a context the caller owns, not in the
//    layer: make_ctx() returns a fresh one (a layer's `Saved` struct: the
//    inputs it keeps, its outputs and gradient buffers, its kernels' saved
//    state; a composite's holds its children's), and forward/backward take it.
//    The compute methods are const, so a layer cannot write a member during
//    them; what is not micro-batch state (oneDNN plans cached per shape in the
//    kernels, bf16 weight copies, running statistics, Dropout's call count) is
//    marked mutable or lives in the kernel. A pipeline slot is the set of its
//    layers' contexts; dropping a context frees its activations (recomputation).
//  - Outputs live in buffers in the context and are reused while the input
//    shape is unchanged: a returned Tensor is valid until the next forward
//    (resp. backward) with the same context. No allocation per step after the first.
//  - forward keeps a reference to its input for the backward; the caller must
//    not overwrite the input in between (a Stage never does).
//  - backward overwrites dx and writes parameter gradients into the arena's
//    grad views: overwrite when accumulate is false, add when true.
//  - Split backward (pipeline schedules, zero-bubble): backward_input(dy)
//    returns dx and backward_weight() then adds what it deferred. A layer that
//    does not split computes everything in backward_input and nothing in
//    backward_weight, so callers may always call both; splits_backward() says
//    whether the weight half really is deferred. backward_weight must come
//    before the context's next forward.
//  - A layer used on its own (one micro-batch in flight: tests, tools) may
//    call the overloads without a context: they use one the layer owns
//    (own_ctx). Composites and stages never do; they pass their children's.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ringtrain/core/tensor.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/parameters.hpp"

namespace ringtrain {

class Loss;  // nn/loss.hpp

enum class Mode { train, eval };

// Weight initialisation; biases start at zero, BatchNorm at gamma 1, beta 0.
enum class Init {
  kaiming_normal,   // N(0, 2 / fan_in): layers followed by ReLU
  kaiming_uniform,  // U(+-sqrt(6 / fan_in))
  xavier_uniform,   // U(+-sqrt(6 / (fan_in + fan_out))): layers feeding a softmax
  xavier_normal,    // N(0, 2 / (fan_in + fan_out))
};

// A running statistic or other non-trainable state that checkpoints keep.
struct NamedBuffer {
  std::string name;  // "bn1.running_mean"
  Tensor tensor;     // on the model's device
  ShardSpec shard;   // tensor parallelism: a part of a whole buffer (replicated by default)
};

// Where a forward stands in the run, for layers that draw random numbers
// (Dropout): the optimizer step, and the position of the micro-batch's first
// sample in the step's global batch (its place in the epoch's permutation,
// data/sampler.hpp). Keyed by these, masks are the same at every layout and
// need no state of their own to resume. A stage passes it with each forward (Call).
struct SamplePosition {
  std::uint64_t step = 0;
  std::int64_t first_sample = 0;
  // Activation recomputation (Recomputed, train.recompute): this forward repeats an
  // earlier one for its backward. Layers must reproduce it exactly and leave
  // running state alone (BatchNorm's running or deferred statistics).
  bool replay = false;
};

// What bind() needs: the device's backend, the finalised arena, the model seed.
struct BindContext {
  Backend& backend;
  Device device;
  const ParamArena& arena;
  std::uint64_t seed = 0;
  MathMode math = MathMode::fp32;  // for Conv2d/Linear kernels (backend.hpp)
};

// How one forward runs: its mode and, for layers that draw random numbers or
// keep running statistics, where it stands. Without a position (a layer run on
// its own) Dropout keys its masks by its own call count.
struct Call {
  Mode mode = Mode::eval;
  std::optional<SamplePosition> position;
  Call(Mode m = Mode::eval) : mode(m) {}  // NOLINT: a Mode is a Call without a position
  Call(Mode m, const SamplePosition& p) : mode(m), position(p) {}
  bool train() const { return mode == Mode::train; }
  bool replay() const { return position && position->replay; }
};

// A layer's per-micro-batch context (see the rules above). The base holds what
// every layer checks: the last forward's input shape and mode.
class Ctx {
 public:
  virtual ~Ctx() = default;
  Shape in_shape;
  Mode mode = Mode::eval;
  bool has_forward = false;
};
using CtxPtr = std::unique_ptr<Ctx>;

// The context of a layer whose state is the struct S (its `Saved`).
template <class S>
struct SavedCtx final : Ctx {
  S s;
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return name_; }
  virtual const char* type() const = 0;  // "Conv2d"

  // Registers this layer's parameters under "<prefix><name>.<param>", tagged
  // with the owning top-level layer index.
  virtual void register_params(ParamArena& arena, int layer_index, const std::string& prefix) {}
  // After the arena is finalised: parameter views, kernels, buffers.
  virtual void bind(const BindContext& ctx) {}
  // Writes initial values (host-generated from a counter RNG, copied to the device).
  virtual void init(const ParamArena& arena, std::uint64_t seed) {}
  // Output shape for an input shape; throws Error naming the layer if invalid.
  virtual Shape output_shape(const Shape& in) const = 0;
  virtual std::vector<NamedBuffer> buffers() const { return {}; }
  // Multiply-add FLOPs (2 per FMA) of conv/linear math in one forward.
  virtual double forward_flops(const Shape& in) const { return 0; }

  // Arena indices of this layer's parameters (children included), in order.
  const std::vector<std::size_t>& params() const { return params_; }

  // A fresh context for one micro-batch (see the rules above).
  virtual CtxPtr make_ctx() const = 0;
  Tensor forward(const Tensor& x, Ctx& c, const Call& call) const;
  // Returns dx (undefined when need_dx is false: the first layer skips it).
  Tensor backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const;
  // The two halves of backward (see the rules above); same checks as backward.
  Tensor backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const;
  void backward_weight(Ctx& c) const { do_backward_weight(c); }
  // The same on the layer's own context (one micro-batch in flight).
  Tensor forward(const Tensor& x, const Call& call) { return forward(x, own_ctx(), call); }
  Tensor backward(const Tensor& dy, bool need_dx, bool accumulate) {
    return backward(dy, own_ctx(), need_dx, accumulate);
  }
  Tensor backward_input(const Tensor& dy, bool need_dx, bool accumulate) {
    return backward_input(dy, own_ctx(), need_dx, accumulate);
  }
  void backward_weight() { backward_weight(own_ctx()); }
  Ctx& own_ctx();
  // Frees what the own context holds (a fresh one is made on the next forward).
  void release_own_ctx() { own_.reset(); }
  virtual bool splits_backward() const { return false; }
  // Calls f on each direct child of a composite layer (Sequential, Residual,
  // ResidualStack), so callers can reach nested layers (a pipeline stage's
  // BatchNorm2d layers) without knowing the container. Leaves have none.
  virtual void for_each_child(const std::function<void(Layer&)>& f) {}
  // Whether forward/backward take bfloat16 activations (train.precision = bf16
  // on a backend with Backend::bf16_activations): output and input gradient
  // then have the input's type, parameter gradients stay float32. A Stage
  // runs its layers in bf16 only when all of them do (composites ask their children).
  // It means 16-bit float activations: float16 too (train.precision = fp16 on
  // a backend with Backend::fp16_activations, i.e. CUDA). The CPU backend
  // does not say fp16_activations, so a Stage never picks fp16 there.
  virtual bool takes_bf16() const { return false; }
  // A layer whose input is token ids (TokenEmbedding): a Stage passes its
  // float32 input uncast (ids above 256 are not bfloat16 numbers) and names
  // the activation type it must output.
  virtual bool takes_token_ids() const { return false; }
  // The loss this layer's output needs when it ends the model (a
  // vocabulary-split head's), or null: the model's default (nn/model.hpp's model_loss).
  virtual std::shared_ptr<const Loss> output_loss() const { return nullptr; }
  virtual void set_output_dtype(DType) {}

 protected:
  virtual Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const = 0;
  virtual Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const = 0;
  // Defaults: the whole backward in the input half, nothing deferred.
  virtual Tensor do_backward_input(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
    return do_backward(dy, c, need_dx, accumulate);
  }
  virtual void do_backward_weight(Ctx& c) const {}
  // c's state as the S that this layer's make_ctx made (an Error naming the
  // layer when c belongs to another layer type).
  template <class S>
  S& saved(Ctx& c) const {
    auto* t = dynamic_cast<SavedCtx<S>*>(&c);
    RT_CHECK(t, "layer '", name_, "' (", type(), "): called with another layer's context");
    return t->s;
  }
  template <class S>
  static CtxPtr ctx_of() {
    return std::make_unique<SavedCtx<S>>();
  }
  // Registers one parameter and remembers its index.
  std::size_t add_param(ParamArena& arena, const std::string& prefix, const std::string& pname, Shape shape,
                        DType dt, bool decay, int layer_index);
  // Returns `slot`, reallocated only when shape/dtype/device changed.
  static Tensor& ensure(Tensor& slot, const Shape& shape, DType dt, Device dev);

  std::string name_;
  std::vector<std::size_t> params_;

 private:
  CtxPtr own_;  // the overloads without a context (see the rules above)
};

// A weight in another dtype (the bfloat16 or float16 copy that 16-bit
// activations multiply by), cast from the float32 master again on first use after the arena's
// version moved on: once per step after the update, and after a checkpoint
// load, a broadcast or a ZeRO gather. Linear, Conv2d and the LM head hold one.
class WeightCopy {
 public:
  const Tensor& of(const Tensor& w, DType dt, Backend& be, const ParamArena& arena) const;
  void invalidate() { valid_ = false; }

 private:
  // A cache derived from the parameters, not micro-batch state: refreshed from const forwards.
  mutable Tensor copy_;
  mutable std::uint64_t version_ = 0;
  mutable bool valid_ = false;
};

using LayerPtr = std::unique_ptr<Layer>;

}  // namespace ringtrain
