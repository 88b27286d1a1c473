// The registry of backends: one entry per device kind. The CPU backend is built
// into ringtrain_nn and created on first use; others call register_backend()
// from their module, which backend_for() loads on first demand (device_module.hpp).
#include "../backend/cpu/cpu_backend.hpp"
#include "ringtrain/core/device_module.hpp"
#include "ringtrain/core/kind_registry.hpp"
#include "ringtrain/nn/backend.hpp"

namespace ringtrain {
namespace {

KindRegistry<Backend>& registry() {
  static KindRegistry<Backend> r;
  return r;
}

const char* kind_name(DeviceKind k) { return k == DeviceKind::cpu ? "cpu" : "cuda"; }

}  // namespace

void register_backend(DeviceKind kind, std::unique_ptr<Backend> b) {
  RT_CHECK(b != nullptr, "register_backend: null backend for ", kind_name(kind));
  registry().set(kind, std::move(b));
}

bool has_backend(DeviceKind kind) { return kind == DeviceKind::cpu || registry().has(kind); }

Backend& backend_for(DeviceKind kind) {
  if (kind != DeviceKind::cpu && !registry().has(kind)) load_device_module(kind);
  Backend* b = registry().get(kind, kind == DeviceKind::cpu ? &make_cpu_backend : nullptr);
  RT_CHECK(b != nullptr, "no compute backend for device kind '", kind_name(kind),
           "' (HINT: this build has no CUDA backend; rebuild with -DRINGTRAIN_CUDA=ON or use --device cpu)");
  return *b;
}

MathMode parse_math_mode(const std::string& s) {
  for (MathMode m : {MathMode::fp32, MathMode::tf32, MathMode::bf16, MathMode::fp16})
    if (s == math_mode_name(m)) return m;
  RT_FAIL("math mode '", s, "' is not one of fp32, tf32, bf16, fp16");
}

const char* math_mode_name(MathMode m) {
  switch (m) {
    case MathMode::tf32: return "tf32";
    case MathMode::bf16: return "bf16";
    case MathMode::fp16: return "fp16";
    default: return "fp32";
  }
}

}  // namespace ringtrain
