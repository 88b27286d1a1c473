#pragma once
// Stage: the contiguous top-level layers [first, end) of a model that one
// pipeline rank runs, with its own ParamArena (parameters and gradients of
// those layers only; the optimizer built over it holds only their state).
//
// Rules:
//  - Activation slots: a schedule keeps up to `slots` micro-batches between
//    their forward and their weight backward (schedule.hpp peak_in_flight).
//    The stage has ONE copy of its layers; each slot is a MicroBatchState
//    (nn/micro_batch_state.hpp): the activations, gradient buffers and kernel
//    state (BatchNorm's batch statistics, pooling indices, attention
//    probabilities, dropout masks) its micro-batch's forward left, swapped
//    into the layers for each of its passes. Parameters, bf16 weight copies,
//    running statistics and the kernels' cached primitives are shared. A slot
//    is busy from forward() to backward_weight(). A stage of several slots
//    refuses a layer that does not list its state (Layer::visit_state).
//  - A stage allocates and initialises only its own layers. Parameters start
//    equal to the unpipelined model's built from the same ModelConfig (values
//    are drawn per model parameter index, ParamArena::set_index_base), so
//    every stage count starts from the same weights. A tied LM head on a
//    later stage than its embedding holds a copy of the embedding's weight
//    (nn/language.hpp split_tied_layers; ParamInfo::copy_of), drawn alike.
//  - Gradients accumulate over the step's micro-batches: zero_grads() first.
//  - BatchNorm: each micro-batch is normalised with its own statistics (as
//    GPipe). By default every forward updates the running statistics (once
//    per micro-batch, in micro-batch order). With set_deferred_batch_stats(true)
//    (build_parts, m > 1) the forwards only accumulate their batch statistics
//    into one record per layer, and commit_batch_stats() updates the running
//    statistics once with the whole step's mean and unbiased variance
//    (torchgpipe's DeferredBatchNorm; BatchNorm2d::set_deferred_stats).
//  - Recomputation (set_recompute, train.recompute): `block` keeps, per slot,
//    only each top-level layer's input (the block's: a vit block, a resnet
//    BasicBlock, else a single layer) and releases the layer's activations
//    right after its forward; the backward reruns the layer's forward from that
//    input just before its backward, at the slot's SamplePosition marked
//    replay (the same dropout masks, no BatchNorm statistics updated), and
//    releases it again after its backward (after backward_weight where the
//    layer defers its weight gradients). `attention` keeps everything but the
//    attention probabilities, recomputed inside the attention's backward
//    (MultiHeadSelfAttention::set_recompute_core). Either gives bitwise the
//    same gradients as `none`; a row-parallel layer's replay all-reduces again.
//  - Mixed precision: with train.precision = bf16, a backend that takes
//    bfloat16 activations and layers that all do (Layer::takes_bf16), the
//    layers run in bf16: forward casts its float32 input to bf16 (not token
//    ids: an embedding reads them as they are, Layer::takes_token_ids) and the
//    last layer's output back to float32 (the loss and its gradient stay
//    float32; an LM head already gives float32 logits),
//    backward casts the same way; stage inputs, outputs and their gradients
//    are float32 at the boundary, so pipelines and losses see no difference.
//    Parameters and their gradients stay float32 (masters); a Linear uses a
//    bf16 copy of its weight cast after each update. Otherwise bf16 only
//    allows down-conversion inside kernels (backend.hpp MathMode).
//    train.precision = fp16 does the same in float16 where the backend takes
//    it (Backend::fp16_activations: CUDA; not with token ids): backward's
//    float32 dy is already multiplied by the loss scale when it is cast, and
//    an overflow there reaches the float32 parameter gradients as inf/NaN,
//    which the loss scaler finds (the step is skipped). On the CPU fp16 keeps
//    float32 storage.
//  - Hooks: grad_ready(local layer index) fires once a layer's gradient for
//    the micro-batch is complete (after backward_input for layers that do not
//    split, after backward_weight for those that do).
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/nn/model.hpp"

namespace ringtrain {

// train.recompute: which activations the backward recomputes instead of keeping.
enum class Recompute { none, attention, block };
Recompute parse_recompute(const std::string& s);  // "none" | "attention" | "block"

// Where a stage's layers use their parameters, for a part that holds them
// only while in use (ZeRO-3, parallel/zero3.cpp): use() comes before a layer's
// forward, its backward (before a recomputation's replay) and its deferred
// weight backward; end_pass() after the stage's pass over its layers. Forward
// passes visit the layers in ascending order, the others in descending order.
class ParamAccess {
 public:
  enum class Pass { forward, backward, weight };
  virtual ~ParamAccess() = default;
  virtual void use(int local_layer, Pass pass) = 0;
  virtual void end_pass() = 0;
};

// A contiguous range of top-level layers [first, end): one model chunk.
struct LayerRange {
  int first = 0, end = 0;
};

class Stage {
 public:
  using GradReady = std::function<void(int local_layer)>;

  Stage(const ModelConfig& mc, Device dev, int first, int end, int slots);
  // The whole model: every top-level layer, one activation slot.
  Stage(const ModelConfig& mc, Device dev);
  ~Stage();
  // Input and output shapes of layers [first, end) for n samples, without
  // allocating anything (the executor sizes its buffers before the stage exists).
  static std::pair<Shape, Shape> boundary_shapes(const ModelConfig& mc, Device dev, int first, int end,
                                                 std::int64_t n);

  int first_layer() const { return first_; }
  int end_layer() const { return end_; }
  int num_layers() const { return end_ - first_; }
  int slots() const { return static_cast<int>(states_.size()); }
  Layer& layer(int local) { return *layers_.at(static_cast<std::size_t>(local)); }
  ParamArena& arena() { return arena_; }
  Device device() const { return device_; }
  // Input / output shape of this stage for a batch of n samples.
  Shape input_shape(std::int64_t n) const;
  Shape output_shape(std::int64_t n) const;
  std::vector<NamedBuffer> buffers() const;  // the layers' (the running statistics)

  // One chunk per stage for now: chunk must be 0 (the executor speaks in chunks).
  Stage(const ModelConfig& mc, Device dev, std::vector<LayerRange> chunks, int slots)
      : Stage(mc, dev, one(chunks).first, one(chunks).end, slots) {}
  int num_chunks() const { return 1; }
  LayerRange chunk(int c) const { return {first_, end_}; }
  Shape input_shape(int chunk, std::int64_t n) const { return input_shape(n); }
  Tensor forward(int chunk, int slot, const Tensor& x, Mode mode, const SamplePosition& pos) {
    position_ = {pos.step, pos.first_sample};
    return forward(slot, x, mode);
  }
  Tensor backward_input(int chunk, int slot, const Tensor& dy, bool need_dx, const GradReady& ready) {
    return backward_input(slot, dy, need_dx, ready);
  }
  void backward_weight(int chunk, int slot, const GradReady& ready) { backward_weight(slot, ready); }

  Tensor forward(int slot, const Tensor& x, Mode mode);
  // need_dx: whether the stage's input gradient is wanted (false on the first stage).
  Tensor backward_input(int slot, const Tensor& dy, bool need_dx, const GradReady& ready = {});
  void backward_weight(int slot, const GradReady& ready = {});
  // The next backward starts the step's gradients. Fused backward: its first
  // micro-batch overwrites them (no pass to zero them); else they are zeroed now.
  void zero_grads() {
    if (fused_) overwrite_next_ = true;
    else arena_.zero_grads();
  }
  // Fused (schedules without a deferred W: afab, 1f1b): backward_input runs
  // each layer's whole backward (the unsplit kernels, input and weight
  // gradients together, a layer's gradients ready at once), backward_weight
  // does nothing. Micro-batches must then be backwarded in order.
  void set_fused_backward(bool on) { fused_ = on; }
  // Deferred BatchNorm running statistics (see the rules above); returns the
  // number of BatchNorm2d layers of the stage.
  int set_deferred_batch_stats(bool on);
  void commit_batch_stats();
  // Where the next forward stands (Dropout masks; layer.hpp SamplePosition).
  void set_position(std::uint64_t step, std::int64_t first_sample) { position_ = {step, first_sample}; }
  // Activation recomputation (see the rules above); set before the first forward.
  void set_recompute(Recompute r);
  Recompute recompute() const { return recompute_; }
  // ZeRO-3: told before each layer uses its parameters (null: they are always there).
  void set_param_access(ParamAccess* a) { access_ = a; }
  // The type the layers' activations have: float32, or bfloat16 (see the rules above).
  DType activation_dtype() const { return act_; }

 private:
  static const LayerRange& one(const std::vector<LayerRange>& c) {
    RT_CHECK(c.size() == 1, "pipeline stage: several model chunks per rank are not built yet");
    return c.front();
  }
  Device device_;
  int first_, end_;
  Shape sample_in_;  // stage input without the batch
  ParamArena arena_;
  std::vector<LayerPtr> layers_;
  std::vector<MicroBatchState> states_;  // per slot (one slot: the layers keep it)
  class Loaded;
  int first_param_layer_ = 0;  // without an input gradient, backward stops here
  bool deferred_bn_ = false;
  bool fused_ = false, overwrite_next_ = false;
  SamplePosition position_;  // the layers read it through BindContext::position
  Recompute recompute_ = Recompute::none;
  ParamAccess* access_ = nullptr;
  void use(int local, ParamAccess::Pass p) {
    if (access_) access_->use(local, p);
  }
  void end_pass() {
    if (access_) access_->end_pass();
  }
  // Per slot, recompute = block: each layer's input, and where the forward stood.
  std::vector<std::vector<Tensor>> inputs_;
  std::vector<SamplePosition> slot_position_;
  DType act_ = DType::f32;
  // Per slot, 16-bit activations: the cast input and output, and their gradients.
  std::vector<Tensor> in16_, out32_, dy16_, dx32_;
  Tensor cast_to(std::vector<Tensor>& slot_buffers, int slot, const Tensor& t, DType dt);
  void replay(int slot, int local);  // reruns layer `local`'s forward of the slot's micro-batch
};

}  // namespace ringtrain
