#pragma once
// Language-model layers (the `gpt` model, models.cpp): token ids in, per-token
// logits out. Token ids arrive as float32 [N, T] (the loader's batch, exact
// below 2^24); logits leave as [N, T, vocab] for the per-token softmax
// cross-entropy (nn/loss.hpp).
//
// Tying: LmHead has no parameters of its own; it multiplies by the weight of
// the TokenEmbedding named `tie` ("<tie>.weight", found in the arena when
// bound), so both must be on one pipeline stage. The head's backward writes
// that weight's gradient first (it runs first) and the embedding then adds
// its part: tie_to() marks the embedding so it always accumulates.
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
  // bf16 activations: float32 ids in, bfloat16 rows out (the Stage names the type).
  bool takes_bf16() const override { return true; }
  bool takes_token_ids() const override { return true; }
  void set_output_dtype(DType dt) override { out_dt_ = dt; }
  std::int64_t vocab() const { return vocab_; }
  std::int64_t dim() const { return dim_; }
  // An LmHead reads and also writes this weight's gradient: always accumulate.
  void tie_to_head() { tied_ = true; }
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
  bool tied_ = false;
  DType out_dt_ = DType::f32;
  Tensor weight, pos, dweight, dpos, y_;
  std::vector<std::int32_t> ids_;
};

// x [N, T, dim] -> logits [N, T, vocab] = x W^T, W the tied embedding's weight
// [vocab, dim] (the backend's Linear kernel, no bias). bfloat16 activations
// multiply with a bf16 copy of W (cast when the arena's version moves on) and
// give float32 logits (the loss's type: no rounding of them, no cast of [N, T, vocab]).
class LmHead : public Layer {
 public:
  LmHead(std::string name, std::string tie, std::int64_t vocab, std::int64_t dim);
  const char* type() const override { return "LmHead"; }
  bool takes_bf16() const override { return true; }
  const std::string& tie() const { return tie_; }
  void release_activations() override;
  void bind(const BindContext& ctx) override;
  Shape output_shape(const Shape& in) const override;
  double forward_flops(const Shape& in) const override;

 protected:
  Tensor do_forward(const Tensor& x, Mode mode) override;
  Tensor do_backward(const Tensor& dy, bool need_dx, bool accumulate) override;

 private:
  const Tensor& weight_for(DType dt);
  std::string tie_;
  std::int64_t vocab_, dim_;
  Tensor weight, dweight, x_, y_, dx_, w16_;
  std::unique_ptr<LinearKernel> k_;
  Backend* be_ = nullptr;
  const ParamArena* arena_ = nullptr;
  std::uint64_t w16_version_ = 0;
  bool w16_valid_ = false;
};

}  // namespace ringtrain
