// The registry of device runtimes (one per device kind) and the built-in CPU
// runtime, created on first use like the CPU backend.
#include "ringtrain/parallel/device_runtime.hpp"

#include "ringtrain/core/kind_registry.hpp"
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
  double grad_sq_norm(const ParamArena& arena, const std::vector<char>& include) override {
    return ringtrain::grad_sq_norm(arena, include);
  }
};

KindRegistry<DeviceRuntime>& registry() {
  static KindRegistry<DeviceRuntime> r;
  return r;
}

std::unique_ptr<DeviceRuntime> make_cpu_runtime() { return std::make_unique<CpuRuntime>(); }

}  // namespace

void register_device_runtime(DeviceKind kind, std::unique_ptr<DeviceRuntime> rt) {
  RT_CHECK(rt != nullptr && rt->kind() == kind, "register_device_runtime: bad runtime for ", Device{kind, 0}.str());
  registry().set(kind, std::move(rt));
}

bool has_device_runtime(DeviceKind kind) { return kind == DeviceKind::cpu || registry().has(kind); }

DeviceRuntime& device_runtime(DeviceKind kind) {
  DeviceRuntime* rt = registry().get(kind, kind == DeviceKind::cpu ? &make_cpu_runtime : nullptr);
  RT_CHECK(rt != nullptr, "no device runtime for '", Device{kind, 0}.str(),
           "' (this build has no CUDA support, or no GPU is present); use train.device = cpu");
  return *rt;
}

}  // namespace ringtrain
