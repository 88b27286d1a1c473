// The registry of device runtimes (one per device kind) and the built-in CPU
// runtime, created on first use like the CPU backend.
#include "ringtrain/train/device_runtime.hpp"

#include <array>
#include <mutex>

#include "ringtrain/optim/grad_utils.hpp"

namespace ringtrain {
namespace {

class CpuRuntime final : public DeviceRuntime {
 public:
  DeviceKind kind() const override { return DeviceKind::cpu; }
  Device select(const Communicator&) override { return Device::cpu(); }
  std::unique_ptr<Optimizer> make_optimizer(ParamArena& arena, const OptimizerConfig& cfg) override {
    return ringtrain::make_optimizer(arena, cfg);
  }
  std::shared_ptr<FusionOps> fusion_ops(Device) override { return nullptr; }
  void scale(Tensor& t, double s) override {
    RT_CHECK(t.device().is_cpu() && t.dtype() == DType::f32, "cpu runtime scale: needs a float32 CPU tensor, got ",
             dtype_name(t.dtype()), " on ", t.device().str());
    float* p = t.data<float>();
    const float f = static_cast<float>(s);
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] *= f;
  }
  bool unscale_grads(ParamArena& arena, double inv_scale) override {
    return ringtrain::unscale_grads(arena, inv_scale);
  }
  double clip_grad_norm(ParamArena& arena, double max_norm) override {
    return ringtrain::clip_grad_norm(arena, max_norm);
  }
};

struct Registry {
  std::mutex mu;
  std::array<std::unique_ptr<DeviceRuntime>, 2> slots;  // indexed by DeviceKind
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_device_runtime(DeviceKind kind, std::unique_ptr<DeviceRuntime> rt) {
  RT_CHECK(rt != nullptr && rt->kind() == kind, "register_device_runtime: bad runtime for ", Device{kind, 0}.str());
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.slots[static_cast<std::size_t>(kind)] = std::move(rt);
}

bool has_device_runtime(DeviceKind kind) {
  if (kind == DeviceKind::cpu) return true;
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.slots[static_cast<std::size_t>(kind)] != nullptr;
}

DeviceRuntime& device_runtime(DeviceKind kind) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto& slot = r.slots[static_cast<std::size_t>(kind)];
  if (!slot && kind == DeviceKind::cpu) slot = std::make_unique<CpuRuntime>();
  RT_CHECK(slot != nullptr, "no device runtime for '", Device{kind, 0}.str(),
           "' (this build has no CUDA support, or no GPU is present); use train.device = cpu");
  return *slot;
}

}  // namespace ringtrain
