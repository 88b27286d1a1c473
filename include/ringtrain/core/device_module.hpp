#pragma once
// Device backends other than the CPU live in modules loaded on demand, so that
// a CPU rank never maps the GPU libraries (cuDNN/cuBLAS alone are ~200 MB of
// RSS). The CUDA backend is libringtrain_cuda.so; loading it runs its
// registration (allocator, backend, device collectives, device runtime) from
// its initialiser. The registries load it the first time a CUDA object is
// asked for; the trainer loads it for train.device = cuda, and for auto when
// an NVIDIA driver is present.
//
// Where it is looked for, in order: the folder of the ringtrain library that
// holds this code (the build tree, or lib/ of an installed tree, moved or
// not), then the install prefix's lib/ it was configured with. The first file
// found is loaded; if that fails, the error says why (no other is tried).
// A program that links the module (tests/gpu) has it loaded already.
#include <string>
#include <vector>

#include "ringtrain/core/device.hpp"

namespace ringtrain {

// Loads the module of `kind` once per process (a no-op for the CPU). Throws
// Error naming every path tried with the loader's dlerror() text (e.g. which
// libcudnn.so is missing); later calls throw the same error without retrying.
void load_device_module(DeviceKind kind);

// The paths load_device_module(kind) tries, in order.
std::vector<std::string> device_module_paths(DeviceKind kind);

// A cheap check whether this host can have a device of `kind` at all, without
// loading any GPU library: for CUDA, the NVIDIA driver's /dev/nvidiactl or
// /proc/driver/nvidia. train.device = auto loads the module only then.
bool device_driver_present(DeviceKind kind);

}  // namespace ringtrain
