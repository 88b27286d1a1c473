#pragma once
// Fused optimizer updates on the GPU over a ParamArena that lives on a CUDA
// device: SGD (momentum, dampening, Nesterov, coupled weight decay), Adam,
// AdamW and LAMB (two phases with per-tensor norms). The per-element math is
// optim/update_math.hpp's RT_HD functions — the CPU optimizers' code — so
// device and host differ only where LAMB's norms are summed in another order.
//
// Rules kept:
//  - One launch per phase over every parameter of a dtype: a device table of
//    (offset, n, decay) segments, grid.y = segment.
//  - The step counter lives on the device, so dynamic loss scaling never
//    needs the host: step(lr, skip) with skip = DynamicLossScaler::
//    found_inf_ptr() leaves parameters, state AND the counter untouched when
//    *skip is set (Adam's bias correction stays right).
//  - LAMB's norms are summed in double in a fixed order (per-block partials,
//    then one thread per tensor): bitwise identical on every rank.
//  - State buffers have the arena's flat layout (names as the CPU optimizer's
//    state(): "<dtype>.exp_avg" ...), so checkpoints can be shared.
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/cuda/context.hpp"
#include "ringtrain/nn/parameters.hpp"
#include "ringtrain/optim/optimizer.hpp"

namespace ringtrain::cuda {

class DeviceOptimizer {
 public:
  // arena: finalised on ctx's device. cfg.name: sgd | adam | adamw | lamb.
  DeviceOptimizer(ParamArena& arena, const OptimizerConfig& cfg, CudaContext& ctx);
  ~DeviceOptimizer();
  DeviceOptimizer(const DeviceOptimizer&) = delete;
  DeviceOptimizer& operator=(const DeviceOptimizer&) = delete;

  // Enqueues one update on the compute stream; nothing happens when skip != null and *skip != 0.
  void step(double lr, const int* skip = nullptr);
  std::int64_t steps() const;  // completed (not skipped) steps; waits for the compute stream
  Optimizer::NamedTensors state() const;  // views of the device state buffers

 private:
  struct Group;  // one parameter dtype
  ParamArena& arena_;
  OptimizerConfig cfg_;
  std::string kind_;
  CudaContext& ctx_;
  std::vector<std::unique_ptr<Group>> groups_;
  void* coeffs_ = nullptr;  // device: step counter and coefficients
};

}  // namespace ringtrain::cuda
