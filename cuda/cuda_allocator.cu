// The CUDA backend's registration: if a CUDA device is present at start-up, the
// device allocator is registered for DeviceKind::cuda. Without a GPU nothing is
// registered and everything CUDA reports "not available" through the registry.
#include <cuda_runtime.h>

#include <memory>

#include "ringtrain/core/allocator.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  RT_CHECK(e == cudaSuccess, what, " failed: ", cudaGetErrorString(e));
}

class CudaAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device dev) override {
    if (bytes == 0) return nullptr;
    check(cudaSetDevice(dev.index), "cudaSetDevice");
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  void deallocate(void* p, std::size_t, Device) override {
    if (p) cudaFree(p);
  }
  void copy(void* dst, Device, const void* src, Device, std::size_t bytes) override {
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
  }
  void zero(void* p, std::size_t bytes, Device dev) override {
    check(cudaSetDevice(dev.index), "cudaSetDevice");
    check(cudaMemset(p, 0, bytes), "cudaMemset");
  }
};

bool register_cuda() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  register_allocator(DeviceKind::cuda, std::make_unique<CudaAllocator>());
  return true;
}

const bool registered = register_cuda();

}  // namespace

bool available() { return registered; }

}  // namespace ringtrain::cuda
