#pragma once
// Stage: the top-level layers that one pipeline rank runs, in one or more
// chunks (contiguous layer ranges [first, end) of the model: an interleaved
// or V schedule gives a rank several), with ONE ParamArena for all of them
// (parameters and gradients of those layers only; grad sync, the updater,
// ZeRO, model state and checkpoints see the rank's parameters as one set).
//
// Rules:
//  - Local layer indices number the rank's layers across chunks in chunk
//    order (chunk 0's first): layer(i), GradReady and ParamAccess::use use them.
//  - Activation slots: a schedule keeps up to `slots` micro-batches per chunk
//    between their forward and their weight backward (schedule.hpp
//    peak_in_flight). The stage has ONE copy of its layers; a slot is the set
//    of its layers' contexts (Layer::make_ctx, nn/layer.hpp): the
//    activations, gradient buffers and kernel state (BatchNorm's batch
//    statistics, pooling indices, attention probabilities, dropout masks) its
//    micro-batch's forward left. Parameters, bf16 weight copies, running
//    statistics and the kernels' cached primitives are shared. A slot is busy
//    from forward() to backward_weight().
//  - A stage allocates and initialises only its own layers. Parameters start
//    equal to the unpipelined model's built from the same ModelConfig (values
//    are drawn per model parameter index, ParamArena::set_index_base per
//    chunk), so every layout starts from the same weights. A tied LM head
//    whose embedding is in one of the rank's chunks shares its weight in the
//    arena (the head writes its gradient, the embedding adds its part, as in
//    the unpipelined model); on another rank it holds a copy of the
//    embedding's weight (nn/language.hpp split_tied_layers; ParamInfo::copy_of),
//    drawn alike, whose gradient the ranks sum.
//  - Gradients accumulate over the step's micro-batches: zero_grads() first.
//  - BatchNorm: each micro-batch is normalised with its own statistics (as
//    GPipe). By default every forward updates the running statistics (once
//    per micro-batch, in micro-batch order). With set_deferred_batch_stats(true)
//    (build_parts, m > 1) the forwards only accumulate their batch statistics
//    into one record per layer, and commit_batch_stats() updates the running
//    statistics once with the whole step's mean and unbiased variance
//    (torchgpipe's DeferredBatchNorm; BatchNorm2d::set_deferred_stats).
//  - Recomputation (set_recompute, train.recompute; nn/recompute.hpp):
//    `block` wraps each top-level layer in a Recomputed layer, which keeps
//    per slot only the layer's input (the block's: a vit block, a resnet
//    BasicBlock, else a single layer) and reruns the layer's forward just
//    before its backward, at the slot's SamplePosition marked replay.
//    `attention` keeps everything but the attention probabilities, recomputed
//    inside the attention's backward. Either gives bitwise the same gradients
//    as `none`; a row-parallel layer's replay all-reduces again.
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
#include "ringtrain/parallel/activation_cast.hpp"

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

// A chunk: the model's top-level layers [first, end).
struct LayerRange {
  int first = 0, end = 0;
};

class Stage {
 public:
  using GradReady = std::function<void(int local_layer)>;

  // Several chunks (ascending, disjoint), `slots` activation slots per chunk.
  // chunked_buffers: the arena's flat buffers on a device in chunked memory
  // (ZeRO-2/3 give their chunks back: ParamArena::finalize).
  Stage(const ModelConfig& mc, Device dev, std::vector<LayerRange> chunks, int slots, bool chunked_buffers = false);
  // One chunk.
  Stage(const ModelConfig& mc, Device dev, int first, int end, int slots);
  // The whole model: every top-level layer, one activation slot.
  Stage(const ModelConfig& mc, Device dev);
  ~Stage();
  // Input and output shapes of layers [first, end) for n samples, without
  // allocating anything (the executor sizes its buffers before the stage exists).
  static std::pair<Shape, Shape> boundary_shapes(const ModelConfig& mc, Device dev, int first, int end,
                                                 std::int64_t n);

  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  LayerRange chunk(int c) const { return chunks_.at(static_cast<std::size_t>(c)).range; }
  // Chunk 0's range (the only one of a single-chunk stage).
  int first_layer() const { return chunk(0).first; }
  int end_layer() const { return chunk(0).end; }
  int num_layers() const { return static_cast<int>(layers_.size()); }  // of every chunk
  int slots() const { return static_cast<int>(chunks_[0].slots.size()); }
  Layer& layer(int local) { return *layers_.at(static_cast<std::size_t>(local)); }
  ParamArena& arena() { return arena_; }
  Device device() const { return device_; }
  // Input / output shape of a chunk for a batch of n samples.
  Shape input_shape(int chunk, std::int64_t n) const;
  Shape output_shape(int chunk, std::int64_t n) const;
  Shape input_shape(std::int64_t n) const { return input_shape(0, n); }
  Shape output_shape(std::int64_t n) const { return output_shape(0, n); }
  std::vector<NamedBuffer> buffers() const;  // the layers' (the running statistics)

  // pos: where the micro-batch stands (Dropout masks; layer.hpp SamplePosition).
  Tensor forward(int chunk, int slot, const Tensor& x, Mode mode, const SamplePosition& pos);
  // need_dx: whether the chunk's input gradient is wanted (false on the model's first layers).
  Tensor backward_input(int chunk, int slot, const Tensor& dy, bool need_dx, const GradReady& ready = {});
  void backward_weight(int chunk, int slot, const GradReady& ready = {});
  // A B of a split stage (a table that splits other micro-batches): each
  // layer's whole backward, as a fused stage runs it, without the split's cost
  // of reading the activations again. ready_input announces the layers that do
  // not split their backward (as backward_input does), ready_weight those that
  // do (as backward_weight).
  Tensor backward_whole(int chunk, int slot, const Tensor& dy, bool need_dx, const GradReady& ready_input,
                        const GradReady& ready_weight);
  // Chunk 0.
  Tensor forward(int slot, const Tensor& x, Mode mode, const SamplePosition& pos = {}) {
    return forward(0, slot, x, mode, pos);
  }
  Tensor backward_input(int slot, const Tensor& dy, bool need_dx, const GradReady& ready = {}) {
    return backward_input(0, slot, dy, need_dx, ready);
  }
  void backward_weight(int slot, const GradReady& ready = {}) { backward_weight(0, slot, ready); }
  // The next backward of each chunk starts the step's gradients. Fused
  // backward: its first micro-batch overwrites them (no pass to zero them);
  // else they are zeroed now.
  void zero_grads();
  // Fused (schedules without a deferred W: afab, 1f1b): backward_input runs
  // each layer's whole backward (the unsplit kernels, input and weight
  // gradients together, a layer's gradients ready at once), backward_weight
  // does nothing. Micro-batches must then be backwarded in order per chunk.
  void set_fused_backward(bool on) { fused_ = on; }
  bool fused_backward() const { return fused_; }
  // Deferred BatchNorm running statistics (see the rules above); returns the
  // number of BatchNorm2d layers of the stage.
  int set_deferred_batch_stats(bool on);
  void commit_batch_stats();
  // Activation recomputation (see the rules above); set before the first forward.
  void set_recompute(Recompute r);
  Recompute recompute() const { return recompute_; }
  // ZeRO-3: told before each layer uses its parameters (null: they are always there).
  void set_param_access(ParamAccess* a) { access_ = a; }
  // The type the layers' activations have: float32, or bfloat16 (see the rules above).
  DType activation_dtype() const { return cast_.dtype(); }

 private:
  // One micro-batch in flight on one chunk: its layers' contexts, and the
  // 16-bit casts at the chunk's boundary (activation_cast.hpp).
  struct Slot {
    std::vector<CtxPtr> ctx;
    ActivationCast::Buffers cast;
  };
  struct Chunk {
    LayerRange range;
    int local0 = 0;            // local index of its first layer
    Shape sample_in;           // its input without the batch
    int first_param_layer = 0;  // local: without an input gradient, backward stops here
    bool overwrite_next = false;  // fused: its next backward overwrites the gradients
    std::vector<Slot> slots;
  };
  Device device_;
  ParamArena arena_;
  std::vector<LayerPtr> layers_;  // every chunk's, in chunk order
  std::vector<Chunk> chunks_;
  ActivationCast cast_;  // float32, or 16-bit activation storage (the rules above)
  bool deferred_bn_ = false, fused_ = false;
  Recompute recompute_ = Recompute::none;
  ParamAccess* access_ = nullptr;

  Slot& slot_of(int chunk, int slot);
  Tensor backward_pass(int chunk, int slot, const Tensor& dy, bool need_dx, bool whole, const GradReady& ready_input,
                       const GradReady& ready_weight);
  void make_contexts();  // fresh contexts for every slot
  void use(int local, ParamAccess::Pass p) {
    if (access_) access_->use(local, p);
  }
  void end_pass() {
    if (access_) access_->end_pass();
  }
};

}  // namespace ringtrain
