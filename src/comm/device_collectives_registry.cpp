// Where a device backend registers its collectives (see collectives.hpp):
// one slot per DeviceKind, filled at static initialisation by the backend.
#include <array>
#include <mutex>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain {
namespace {

struct Slots {
  std::mutex mu;
  std::array<DeviceCollectiveFns, 2> fns;  // indexed by DeviceKind
};
Slots& slots() {
  static Slots s;
  return s;
}

}  // namespace

void register_device_collectives(DeviceKind kind, DeviceCollectiveFns fns) {
  auto& s = slots();
  std::lock_guard lk(s.mu);
  s.fns[static_cast<std::size_t>(kind)] = std::move(fns);
}

const DeviceCollectiveFns& device_collectives(Device dev, const char* what) {
  auto& s = slots();
  std::lock_guard lk(s.mu);
  const auto& f = s.fns[static_cast<std::size_t>(dev.kind)];
  RT_CHECK(f.allreduce && f.broadcast, what, ": buffers on ", dev.str(),
           " need the device collectives of the CUDA backend, which this process does not have "
           "(built without CUDA, or no GPU present)");
  return f;
}

}  // namespace ringtrain
