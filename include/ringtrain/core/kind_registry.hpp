#pragma once
// One object per DeviceKind, registered at start-up by the backend that
// provides it (the CPU's built-in ones are made on first use: a static
// initialiser in a static library could be dropped by the linker). Used by the
// nn backends, the device collectives and the trainer's device runtimes.
#include <array>
#include <memory>
#include <mutex>

#include "ringtrain/core/device.hpp"

namespace ringtrain {

template <typename T>
class KindRegistry {
 public:
  void set(DeviceKind kind, std::unique_ptr<T> value) {
    std::lock_guard lk(mu_);
    slots_[index(kind)] = std::move(value);
  }
  bool has(DeviceKind kind) {
    std::lock_guard lk(mu_);
    return slots_[index(kind)] != nullptr;
  }
  // The registered object, or the one make_default() builds on first use
  // (when given); null when there is neither.
  T* get(DeviceKind kind, std::unique_ptr<T> (*make_default)() = nullptr) {
    std::lock_guard lk(mu_);
    auto& slot = slots_[index(kind)];
    if (!slot && make_default) slot = make_default();
    return slot.get();
  }

 private:
  static std::size_t index(DeviceKind k) { return static_cast<std::size_t>(k); }
  std::mutex mu_;
  std::array<std::unique_ptr<T>, 2> slots_;  // indexed by DeviceKind
};

}  // namespace ringtrain
