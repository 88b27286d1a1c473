#pragma once
// Fused optimizer updates on the GPU over a ParamArena that lives on a CUDA
// device: SGD (momentum, dampening, Nesterov, coupled weight decay), Adam,
// AdamW and LAMB (two phases with per-tensor norms). The per-element math is
// optim/update_math.hpp's RT_HD functions — the CPU optimizers' code — so
// device and host differ only where LAMB's norms are summed in another order.
//
// Rules kept:
//  - It is an Optimizer: the same step(lr)/steps()/state()/load_state() as the
//    CPU implementations, the same state names and flat layouts (buffers on
//    the device, "step" on the host), so checkpoints are shared between devices.
//  - One launch per phase over every parameter of a dtype: a device table of
//    (offset, n, decay) segments, grid.y = segment. Everything is enqueued on
//    the context's compute stream; step() never waits for the device.
//  - A skipped step (dynamic loss scaling found inf/NaN) is not calling step(),
//    as on the CPU: the caller decides on the host after the gradient check.
//  - LAMB's norms are summed in double in a fixed order (per-block partials,
//    then one thread per tensor): bitwise identical on every rank.
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/cuda/context.hpp"
#include "ringtrain/nn/parameters.hpp"
#include "ringtrain/optim/optimizer.hpp"

namespace ringtrain::cuda {

class DeviceOptimizer final : public Optimizer {
 public:
  // arena: finalised on ctx's device. cfg.name: sgd | adam | adamw | lamb.
  DeviceOptimizer(ParamArena& arena, const OptimizerConfig& cfg, CudaContext& ctx);
  ~DeviceOptimizer() override;

 private:
  void update(double lr, std::int64_t t) override;
  struct Group;  // one parameter dtype
  std::string kind_;
  CudaContext& ctx_;
  std::vector<std::unique_ptr<Group>> groups_;
  void* coeffs_ = nullptr;  // device: this step's coefficients
};

}  // namespace ringtrain::cuda
