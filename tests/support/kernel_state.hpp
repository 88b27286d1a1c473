#pragma once
// Tests that call backend kernels directly: the forward-to-backward state of
// a kernel (backend.hpp KernelState), one per kernel object, made on first
// use. A forward rewrites it, so a kernel later allocated at the same address
// (same type) may reuse it.
#include <map>
#include <typeindex>
#include <utility>

#include "ringtrain/nn/backend.hpp"

namespace rt_test {

inline ringtrain::KernelState& state_of(const ringtrain::Kernel& k) {
  static std::map<std::pair<const void*, std::type_index>, ringtrain::KernelStatePtr> states;
  auto& s = states[{&k, std::type_index(typeid(k))}];
  if (!s) s = k.make_state();
  return *s;
}
template <class K>
ringtrain::KernelState& state_of(const std::unique_ptr<K>& k) {
  return state_of(*k);
}

}  // namespace rt_test
