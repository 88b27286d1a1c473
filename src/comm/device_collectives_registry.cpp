// Where a device backend registers its collectives (see collectives.hpp):
// one slot per DeviceKind, filled by the backend's module when it loads.
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/device_module.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/kind_registry.hpp"

namespace ringtrain {
namespace {

KindRegistry<DeviceCollectiveFns>& registry() {
  static KindRegistry<DeviceCollectiveFns> r;
  return r;
}

}  // namespace

void register_device_collectives(DeviceKind kind, DeviceCollectiveFns fns) {
  registry().set(kind, std::make_unique<DeviceCollectiveFns>(std::move(fns)));
}

const DeviceCollectiveFns& device_collectives(Device dev, const char* what) {
  if (!dev.is_cpu() && !registry().has(dev.kind)) load_device_module(dev.kind);
  const DeviceCollectiveFns* f = registry().get(dev.kind);
  RT_CHECK(f && f->allreduce && f->broadcast, what, ": buffers on ", dev.str(),
           " need the device collectives of the CUDA backend, which this process does not have "
           "(built without CUDA, or no GPU present)");
  return *f;
}

}  // namespace ringtrain
