#pragma once
// Optimizers over a ParamArena: SGD, Adam, AdamW, LARS, LAMB.
//
// Rules kept here:
// - The optimizer reads arena.grad(i) and updates arena.param(i) in place; the
//   learning rate comes from the caller each step (an LrSchedule), so one
//   object serves every schedule. A skipped step (dynamic loss scaling found
//   inf/NaN) is simply not calling step(): no state changes.
// - State lives beside the arena: one flat buffer per state kind and parameter
//   dtype with the SAME layout (offsets, padding) as arena.params_flat(dtype),
//   plus the step counter as an int64 [1] tensor. state() hands out views of
//   them (write into them to broadcast in place); load_state() copies in.
// - Weight decay (and the LARS/LAMB trust ratio) applies only to parameters with
//   ParamInfo.decay == true (biases and norms are registered with decay=false),
//   unless OptimizerConfig::decay_all is set (PyTorch's default of one group).
// - The update math is optim_math::* (update_math.hpp), shared with CUDA.
// - Results are bitwise reproducible for any thread count (fixed-chunk norms).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/core/tensor.hpp"
#include "ringtrain/nn/parameters.hpp"

namespace ringtrain {

struct OptimizerConfig {
  std::string name = "sgd";   // sgd | adam | adamw | lars | lamb
  double momentum = 0.0;      // sgd, lars
  double dampening = 0.0;     // sgd
  bool nesterov = false;      // sgd (needs momentum > 0 and dampening 0, as PyTorch)
  double weight_decay = 0.0;  // sgd/adam: coupled L2; adamw/lamb: decoupled; lars: in the trust ratio
  double beta1 = 0.9;         // adam, adamw, lamb
  double beta2 = 0.999;
  double eps = 1e-8;          // adam, adamw, lamb (LAMB papers often use 1e-6)
  double trust_coefficient = 0.001;  // lars: η
  double max_trust_ratio = 10.0;     // lamb: clip r to [0, max]; <= 0: no clip
  bool bias_correction = true;       // lamb
  bool decay_all = false;            // also decay (and trust-ratio) params with decay=false
};

// Parses "sgd" | "adam" | "adamw" | "lars" | "lamb" (case-insensitive); throws Error otherwise.
std::string canonical_optimizer_name(const std::string& name);

class Optimizer {
 public:
  using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter from its current gradient with learning rate lr.
  void step(double lr);
  std::int64_t steps() const;  // completed steps

  const OptimizerConfig& config() const { return cfg_; }
  const std::string& name() const { return cfg_.name; }
  ParamArena& arena() const { return arena_; }
  bool decays(std::size_t param) const;  // weight decay / trust ratio apply to param

  // Named state: "<param dtype>.<kind>" flat buffers (e.g. "float32.exp_avg",
  // dtype float32 or float64, same numel as arena.params_flat, on the arena's
  // device) and "step" (int64 [1], on the host).
  // Views: writing into them changes the optimizer state. Fixed order on every rank.
  NamedTensors state() const;
  // Copies every named tensor in; names, dtypes and sizes must match state() exactly.
  void load_state(const NamedTensors& state);

  // ZeRO (sharded_optimizer.hpp): this arena's parameters may be pieces of larger
  // parameters split across ranks. LARS and LAMB hand the hook their per-parameter
  // partial sums of squares (`per` values per parameter, parameter-major) before
  // taking norms, on every step; the hook replaces them by the whole parameters'
  // sums. Unset: the sums are used as they are (bitwise the unhooked update).
  using SumsHook = std::function<void(std::vector<double>& sums, int per)>;
  void set_sums_hook(SumsHook hook) { sums_hook_ = std::move(hook); }

 protected:
  // Validates cfg (Error names the field and value); `name` replaces cfg.name.
  // Any device: a backend's subclass keeps the same state layout.
  Optimizer(ParamArena& arena, OptimizerConfig cfg, const char* name);
  // Applies step number t (1-based) with learning rate lr.
  virtual void update(double lr, std::int64_t t) = 0;
  void require_cpu() const;  // for the CPU implementations below
  // Declares a zeroed state buffer `kind` for every parameter dtype; call in constructors.
  void add_state(const std::string& kind);
  // The flat state buffer `kind` for parameters of dtype `param_dtype`.
  Tensor state_flat(const std::string& kind, DType param_dtype) const;
  void combine_sums(std::vector<double>& sums, int per) const {
    if (sums_hook_) sums_hook_(sums, per);
  }

 private:
  SumsHook sums_hook_;
  ParamArena& arena_;
  OptimizerConfig cfg_;
  Tensor step_;  // int64 [1]
  NamedTensors buffers_;
};

// The CPU implementations. Exact formulas: update_math.hpp. In short, per tensor:
//   sgd   torch.optim.SGD: d = g + wd·w; buf = μ·buf + (1 − dampening)·d (buf = d at step 1);
//         d = nesterov ? d + μ·buf : buf; w −= lr·d
//   adam  torch.optim.Adam (L2 in the gradient), adamw torch.optim.AdamW (w ·= 1 − lr·wd),
//         bias-corrected, eps outside the sqrt
//   lars  λ = η·||w||/(||g|| + wd·||w||) (1 if a norm is 0); v = μ·v + lr·λ·(g + wd·w); w −= v
//   lamb  u = m̂/(sqrt(v̂) + eps) + wd·w; r = min(||w||/||u||, max_trust_ratio) (1 if a norm is 0);
//         w −= lr·r·u
// Tensors with decay=false (unless decay_all): wd = 0 and λ = r = 1.
class Sgd final : public Optimizer {
 public:
  Sgd(ParamArena& arena, OptimizerConfig cfg);

 private:
  void update(double lr, std::int64_t t) override;
};

// Adam (coupled L2) or, with decoupled = true, AdamW (p ← p·(1 − lr·wd)).
class Adam final : public Optimizer {
 public:
  Adam(ParamArena& arena, OptimizerConfig cfg, bool decoupled);

 private:
  void update(double lr, std::int64_t t) override;
  bool decoupled_;
};

class Lars final : public Optimizer {
 public:
  Lars(ParamArena& arena, OptimizerConfig cfg);

 private:
  void update(double lr, std::int64_t t) override;
};

class Lamb final : public Optimizer {
 public:
  Lamb(ParamArena& arena, OptimizerConfig cfg);

 private:
  void update(double lr, std::int64_t t) override;
};

// Builds the optimizer named by cfg.name (canonical_optimizer_name) over a
// finalised CPU arena; every hyper-parameter is validated.
std::unique_ptr<Optimizer> make_optimizer(ParamArena& arena, const OptimizerConfig& cfg);

}  // namespace ringtrain
