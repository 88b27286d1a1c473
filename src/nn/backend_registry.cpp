// The registry of backends: one entry per device kind. The CPU backend is built
// into ringtrain_nn and created on first use (a static initialiser in a static
// library could be dropped by the linker); others call register_backend().
#include <array>
#include <mutex>

#include "../backend/cpu/cpu_backend.hpp"
#include "ringtrain/nn/backend.hpp"

namespace ringtrain {
namespace {

struct Registry {
  std::mutex mu;
  std::array<std::unique_ptr<Backend>, 2> slots;  // indexed by DeviceKind
};

Registry& registry() {
  static Registry r;
  return r;
}

const char* kind_name(DeviceKind k) { return k == DeviceKind::cpu ? "cpu" : "cuda"; }

}  // namespace

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

void register_backend(DeviceKind kind, std::unique_ptr<Backend> b) {
  RT_CHECK(b != nullptr, "register_backend: null backend for ", kind_name(kind));
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.slots[static_cast<std::size_t>(kind)] = std::move(b);
}

bool has_backend(DeviceKind kind) {
  if (kind == DeviceKind::cpu) return true;
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.slots[static_cast<std::size_t>(kind)] != nullptr;
}

Backend& backend_for(DeviceKind kind) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto& slot = r.slots[static_cast<std::size_t>(kind)];
  if (!slot && kind == DeviceKind::cpu) slot = make_cpu_backend();
  RT_CHECK(slot != nullptr, "no compute backend for device kind '", kind_name(kind),
           "' (HINT: this build has no CUDA backend; rebuild with -DRINGTRAIN_CUDA=ON or use --device cpu)");
  return *slot;
}

}  // namespace ringtrain
