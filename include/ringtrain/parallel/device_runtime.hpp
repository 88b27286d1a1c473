#pragma once
// DeviceRuntime: what the parallel parts (parallel/parts.hpp) need from a
// device kind besides the layer math (nn/backend.hpp): binding a rank to a
// device, an optimizer over an arena on it, the fusion engine's byte movers,
// and the few whole-arena gradient operations of a step (scaling, unscaling
// with an inf/NaN check, sums of squares for global-norm clipping). The update
// path calls only this interface, so the step is the same code on every device.
//
// Rules: the CPU runtime is built in; the CUDA runtime registers itself from
// cuda/ at static-initialisation time when a GPU is present (the one place a
// device kind is wired in, like register_backend). Calls that return host
// values (unscale_grads, grad_sq_norm) wait for the device work they read.
#include <memory>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/device.hpp"
#include "ringtrain/core/tensor.hpp"
#include "ringtrain/engine/fusion_ops.hpp"
#include "ringtrain/nn/parameters.hpp"
#include "ringtrain/optim/optimizer.hpp"

namespace ringtrain {

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual DeviceKind kind() const = 0;
  // Binds the calling rank to one device of this kind (node-local rank modulo
  // the device count) before any other work on it, and returns it.
  virtual Device select(const Communicator& world) = 0;
  // The optimizer named by cfg.name over a finalised arena on this kind's device;
  // an Error names the optimizer when the device has no implementation of it.
  virtual std::unique_ptr<Optimizer> make_optimizer(ParamArena& arena, const OptimizerConfig& cfg) = 0;
  // Byte movers for EngineOptions::device_ops, a new set per call: one per engine, whose thread owns it
  // (null: CPU tensors need none).
  virtual std::shared_ptr<FusionOps> fusion_ops(Device dev) = 0;
  // t *= s (floating t).
  virtual void scale(Tensor& t, double s) = 0;
  // Every gradient *= inv_scale; true when all of them are finite afterwards.
  virtual bool unscale_grads(ParamArena& arena, double inv_scale) = 0;
  // Sum of the squared gradients of the parameters `include` selects (indexed
  // like the arena; empty = all of them), in double. Clipping combines these
  // partial sums over the ranks that hold the rest of the model (updater.cpp).
  virtual double grad_sq_norm(const ParamArena& arena, const std::vector<char>& include) = 0;
  // Waits until the device finished the work queued so far (CPU: nothing).
  virtual void synchronize(Device dev) {}
};

void register_device_runtime(DeviceKind kind, std::unique_ptr<DeviceRuntime> rt);
bool has_device_runtime(DeviceKind kind);
// Throws Error naming the kind when nothing is registered (e.g. cuda without a GPU).
DeviceRuntime& device_runtime(DeviceKind kind);

}  // namespace ringtrain
