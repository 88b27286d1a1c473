#pragma once
// What register.cu installs for DeviceKind::cuda besides the allocator and the
// nn backend: the device collectives behind ringtrain::allreduce/broadcast and
// the trainer's device runtime.
#include <memory>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/parallel/device_runtime.hpp"

namespace ringtrain::cuda {

DeviceCollectiveFns make_device_collective_fns();
std::unique_ptr<DeviceRuntime> make_cuda_runtime();

}  // namespace ringtrain::cuda
