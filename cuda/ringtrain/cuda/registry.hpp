#pragma once
// What register.cu installs for DeviceKind::cuda besides the allocator and the
// nn backend: the device collectives behind ringtrain::allreduce/broadcast.
#include "ringtrain/comm/collectives.hpp"

namespace ringtrain::cuda {

DeviceCollectiveFns make_device_collective_fns();

}  // namespace ringtrain::cuda
