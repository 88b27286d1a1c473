// The CUDA backend's registration unit — the one place that decides at run
// time what CUDA provides. Its initialiser runs when the module
// libringtrain_cuda.so is loaded (by core/device_module.cpp on a job's first
// CUDA request, or at start-up by a program that links it). If a CUDA device
// is present, it registers for DeviceKind::cuda: the caching device
// allocator, the cuDNN/cuBLAS backend, the device collectives and the
// trainer's device runtime. Without a GPU nothing is registered and everything
// CUDA reports "not available" through the registries. Open MPI's CUDA
// extension is queried here (an #ifdef is allowed only in this unit).
#include <cuda_runtime.h>
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <memory>

#include <cstdio>

#include "ringtrain/core/allocator.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/cuda/context.hpp"
#include "ringtrain/cuda/memory.hpp"
#include "ringtrain/cuda/backend.hpp"
#include "ringtrain/cuda/mpi_support.hpp"
#include "ringtrain/cuda/registry.hpp"

namespace ringtrain::cuda {
namespace {

CachingDeviceAllocator* g_allocator = nullptr;  // owned by the allocator registry

bool register_cuda() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  auto a = std::make_unique<CachingDeviceAllocator>();
  g_allocator = a.get();
  register_allocator(DeviceKind::cuda, std::move(a));
  // An initialiser must not throw: a bad RINGTRAIN_CUDNN_* falls back to
  // the defaults with a message (the CLI validates it again and fails properly).
  BackendOptions opt;
  try {
    opt = BackendOptions::from_env();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringtrain: %s; using the CUDA backend defaults\n", e.what());
  }
  register_backend(DeviceKind::cuda, make_cuda_backend(opt));
  register_device_collectives(DeviceKind::cuda, make_device_collective_fns());
  register_device_runtime(DeviceKind::cuda, make_cuda_runtime());
  return true;
}

const bool registered = register_cuda();

}  // namespace

bool available() { return registered; }

CachingDeviceAllocator& device_allocator() {
  RT_CHECK(g_allocator != nullptr, "the CUDA device allocator is not available (no GPU present)");
  return *g_allocator;
}

bool mpi_cuda_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  // Compile-time support says the library *can* be CUDA-aware; the run-time
  // query says whether this run's transport actually is.
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

}  // namespace ringtrain::cuda
