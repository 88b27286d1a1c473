// Device chunked memory through CUDA's virtual memory management: see
// ringtrain/cuda/chunked_memory.hpp.
#include "ringtrain/cuda/chunked_memory.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "ringtrain/cuda/check.hpp"
#include "ringtrain/cuda/memory.hpp"

namespace ringtrain::cuda {
namespace {

// The driver calls, resolved once through the runtime (no libcuda at link time).
struct Driver {
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuDeviceGetAttribute) device_attribute = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;

  template <typename F>
  static void resolve(const char* name, F& f) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p) {
      (void)cudaGetLastError();
      RT_FAIL("ZeRO-2/3 on CUDA: the driver has no ", name, " (virtual memory management needs a CUDA 12 driver)");
    }
    f = reinterpret_cast<F>(p);
  }
  Driver() {
    resolve("cuDeviceGet", device_get);
    resolve("cuDeviceGetAttribute", device_attribute);
    resolve("cuMemGetAllocationGranularity", granularity);
    resolve("cuMemAddressReserve", reserve);
    resolve("cuMemAddressFree", address_free);
    resolve("cuMemCreate", create);
    resolve("cuMemRelease", release);
    resolve("cuMemMap", map);
    resolve("cuMemUnmap", unmap);
    resolve("cuMemSetAccess", set_access);
    resolve("cuGetErrorString", error_string);
  }
  void check(CUresult r, const char* what) const {
    if (r == CUDA_SUCCESS) return;
    const char* s = nullptr;
    if (error_string) error_string(r, &s);
    RT_FAIL("ZeRO-2/3 device chunks: ", what, " failed: ", s ? s : "unknown error", " (CUresult ", static_cast<int>(r),
            ")");
  }
};

const Driver& driver() {
  static const Driver d;  // resolved on first use; a failure throws again on the next call
  return d;
}

class VmmMemory final : public ChunkedMemory {
 public:
  VmmMemory(std::size_t bytes, int device) : dev_(device) {
    const Driver& d = driver();
    RT_CUDA(cudaSetDevice(dev_));  // the primary context current on this thread
    CUdevice cu = 0;
    d.check(d.device_get(&cu, dev_), "cuDeviceGet");
    int vmm = 0;
    d.check(d.device_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu),
            "cuDeviceGetAttribute");
    RT_CHECK(vmm, "parallel.zero = 2 or 3 on cuda:", dev_, ": the device has no virtual memory management "
             "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 0); use parallel.zero = 1");
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = dev_;
    d.check(d.granularity(&chunk_, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
    bytes_ = (bytes + chunk_ - 1) / chunk_ * chunk_;
    d.check(d.reserve(&base_, bytes_, chunk_, 0, 0), "cuMemAddressReserve");
    handles_.assign(bytes_ / chunk_, 0);
    access_.location = prop_.location;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    RT_CUDA(cudaStreamCreateWithFlags(&zero_stream_, cudaStreamNonBlocking));
    take_back(0, handles_.size());
    peak_ = resident_;
  }

  ~VmmMemory() override {
    // At exit the driver may be going down: errors are ignored.
    const Driver& d = driver();
    cudaSetDevice(dev_);
    cudaDeviceSynchronize();
    for (std::size_t c = 0; c < handles_.size(); ++c)
      if (handles_[c]) {
        d.unmap(at(c), chunk_);
        d.release(handles_[c]);
      }
    d.address_free(base_, bytes_);
    cudaStreamDestroy(zero_stream_);
    (void)cudaGetLastError();
  }

  void* data() const override { return reinterpret_cast<void*>(base_); }
  std::size_t bytes() const override { return bytes_; }
  std::size_t chunk() const override { return chunk_; }

  void give_back(std::size_t a, std::size_t b) override {
    std::lock_guard<std::mutex> lk(mu_);
    b = std::min(b, handles_.size());
    if (std::none_of(handles_.begin() + a, handles_.begin() + b, [](auto h) { return h != 0; })) return;
    const Driver& d = driver();
    RT_CUDA(cudaSetDevice(dev_));
    RT_CUDA(cudaDeviceSynchronize());  // kernels queued on any stream may still use these chunks
    for (std::size_t c = a; c < b; ++c) {
      if (!handles_[c]) continue;
      d.check(d.unmap(at(c), chunk_), "cuMemUnmap");
      d.check(d.release(handles_[c]), "cuMemRelease");
      handles_[c] = 0;
      resident_ -= chunk_;
    }
  }

  void take_back(std::size_t a, std::size_t b) override {
    std::lock_guard<std::mutex> lk(mu_);
    b = std::min(b, handles_.size());
    const Driver& d = driver();
    bool set = false;
    for (std::size_t c = a; c < b;) {
      if (handles_[c]) {
        ++c;
        continue;
      }
      if (!set) {
        RT_CUDA(cudaSetDevice(dev_));
        set = true;
      }
      std::size_t e = c;  // a run of chunks given back: mapped, made accessible and zeroed together
      for (; e < b && !handles_[e]; ++e) {
        CUmemGenericAllocationHandle h = 0;
        CUresult r = d.create(&h, chunk_, &prop_, 0);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {  // the caching allocator's free blocks first, as it does itself
          device_allocator().release_cached();
          r = d.create(&h, chunk_, &prop_, 0);
        }
        RT_CHECK(r != CUDA_ERROR_OUT_OF_MEMORY, "out of device memory on cuda:", dev_, " taking back a ", chunk_,
                 "-byte chunk of ZeRO's full buffers (", resident_, " bytes of them resident)",
                 " (HINT: lower the batch size or parallel.bucket_bytes)");
        d.check(r, "cuMemCreate");
        const CUresult m = d.map(at(e), chunk_, 0, h, 0);
        if (m != CUDA_SUCCESS) d.release(h);
        d.check(m, "cuMemMap");
        handles_[e] = h;  // mapped: given back by give_back or the destructor from here on
        resident_ += chunk_;
        d.check(d.set_access(at(e), chunk_, &access_, 1), "cuMemSetAccess");
      }
      RT_CUDA(cudaMemsetAsync(reinterpret_cast<void*>(at(c)), 0, (e - c) * chunk_, zero_stream_));
      c = e;
    }
    if (set) RT_CUDA(cudaStreamSynchronize(zero_stream_));  // zeros before any later use, on any stream
    peak_ = std::max(peak_, resident_);
  }

  std::size_t resident_bytes() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return resident_;
  }
  std::size_t peak_resident_bytes() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return peak_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lk(mu_);
    peak_ = resident_;
  }

 private:
  CUdeviceptr at(std::size_t c) const { return base_ + c * chunk_; }

  int dev_;
  CUmemAllocationProp prop_{};
  CUmemAccessDesc access_{};
  std::size_t chunk_ = 0, bytes_ = 0;
  CUdeviceptr base_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;  // per chunk; 0: given back
  cudaStream_t zero_stream_ = nullptr;
  mutable std::mutex mu_;
  std::size_t resident_ = 0, peak_ = 0;
};

}  // namespace

std::shared_ptr<ChunkedMemory> make_chunked_memory(std::size_t bytes, int device) {
  return std::make_shared<VmmMemory>(bytes, device);
}

}  // namespace ringtrain::cuda
