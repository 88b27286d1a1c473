#include "ringtrain/core/allocator.hpp"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "ringtrain/core/device_module.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain {
namespace {

// Live and peak bytes of host tensors (relaxed counters: a few atomic adds per allocation).
std::atomic<std::size_t> g_live{0}, g_peak{0};

class CpuAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device) override {
    if (bytes == 0) return nullptr;
    // 64-byte alignment: cache lines and AVX-512 loads.
    std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    RT_CHECK(p != nullptr, "out of host memory allocating ", bytes, " bytes");
    const std::size_t live = g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::size_t peak = g_peak.load(std::memory_order_relaxed);
    while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, Device) override {
    if (p) g_live.fetch_sub(bytes, std::memory_order_relaxed);
    std::free(p);
  }
  void copy(void* dst, Device, const void* src, Device, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void zero(void* p, std::size_t bytes, Device) override {
    if (bytes) std::memset(p, 0, bytes);
  }
};

struct Registry {
  std::mutex mu;
  std::array<std::unique_ptr<Allocator>, 2> by_kind;
  Registry() { by_kind[static_cast<int>(DeviceKind::cpu)] = std::make_unique<CpuAllocator>(); }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

HostMemoryStats host_memory_stats() {
  return {g_live.load(std::memory_order_relaxed), g_peak.load(std::memory_order_relaxed)};
}
void reset_host_memory_peak() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

void register_allocator(DeviceKind kind, std::unique_ptr<Allocator> a) {
  auto& r = registry();
  std::lock_guard lk(r.mu);
  r.by_kind[static_cast<int>(kind)] = std::move(a);
}

bool has_allocator(DeviceKind kind) {
  auto& r = registry();
  std::lock_guard lk(r.mu);
  return r.by_kind[static_cast<int>(kind)] != nullptr;
}

Allocator& allocator_for(DeviceKind kind) {
  // Not under the lock: the module registers its allocator while it loads.
  if (!has_allocator(kind)) load_device_module(kind);
  auto& r = registry();
  std::lock_guard lk(r.mu);
  auto& a = r.by_kind[static_cast<int>(kind)];
  RT_CHECK(a != nullptr, "device kind '", kind == DeviceKind::cuda ? "cuda" : "cpu",
           "' is not available in this build (was ringtrain built with CUDA, and is a GPU present?)");
  return *a;
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes) {
  if (bytes == 0) return;
  // The non-CPU side's allocator knows how to move bytes to and from the host.
  Device d = dst_dev.is_cpu() ? src_dev : dst_dev;
  allocator_for(d.kind).copy(dst, dst_dev, src, src_dev, bytes);
}

}  // namespace ringtrain
