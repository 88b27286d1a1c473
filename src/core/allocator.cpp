#include "ringtrain/core/allocator.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <mutex>
#include <new>

#include "ringtrain/core/device_module.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain {
namespace {

// Live and peak bytes of host tensors (relaxed counters: a few atomic adds per allocation).
std::atomic<std::size_t> g_live{0}, g_peak{0};
std::atomic<HostAllocObserver> g_observer{nullptr};

void observe(const void* p, std::size_t bytes, bool allocated) {
  if (HostAllocObserver f = g_observer.load(std::memory_order_relaxed)) f(p, bytes, allocated);
}

void count_alloc(std::size_t bytes) {
  const std::size_t live = g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

class CpuAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device) override {
    if (bytes == 0) return nullptr;
    // 64-byte alignment: cache lines and AVX-512 loads.
    std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    RT_CHECK(p != nullptr, "out of host memory allocating ", bytes, " bytes");
    count_alloc(bytes);
    observe(p, bytes, true);
    return p;
  }
  void deallocate(void* p, std::size_t bytes, Device) override {
    if (p) observe(p, bytes, false);
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

std::size_t read_huge_page() {
  std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes((std::istreambuf_iterator<char>(enabled)), std::istreambuf_iterator<char>());
  if (modes.empty() || modes.find("[never]") != std::string::npos) return 0;
  std::ifstream size("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  std::size_t n = 0;
  return size >> n ? n : 0;
}

}  // namespace

std::size_t host_base_page() {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

std::size_t host_huge_page() {
  static const std::size_t huge = read_huge_page();
  return huge;
}

HostPages allocate_host_pages(std::size_t bytes) {
  HostPages p;
  if (bytes == 0) return p;
  const std::size_t huge = host_huge_page();
  p.chunk = huge && bytes >= huge / 2 ? huge : host_base_page();
  p.bytes = (bytes + p.chunk - 1) / p.chunk * p.chunk;
  // Over-map by one chunk and trim both ends to a chunk-aligned region.
  const std::size_t span = p.bytes + (p.chunk > host_base_page() ? p.chunk : 0);
  void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  RT_CHECK(m != MAP_FAILED, "out of host memory mapping ", bytes, " bytes");
  const auto lo = reinterpret_cast<std::uintptr_t>(m), start = (lo + p.chunk - 1) / p.chunk * p.chunk;
  if (start > lo) munmap(m, start - lo);
  if (lo + span > start + p.bytes) munmap(reinterpret_cast<void*>(start + p.bytes), lo + span - start - p.bytes);
  p.data = reinterpret_cast<void*>(start);
  if (p.chunk != host_base_page()) madvise(p.data, p.bytes, MADV_HUGEPAGE);  // advice: failure is harmless
  p.asked = bytes;
  count_alloc(bytes);
  observe(p.data, bytes, true);
  return p;
}

void free_host_pages(const HostPages& p) {
  if (!p.data) return;
  observe(p.data, p.asked, false);
  munmap(p.data, p.bytes);
  g_live.fetch_sub(p.asked, std::memory_order_relaxed);
}

HostMemoryStats host_memory_stats() {
  return {g_live.load(std::memory_order_relaxed), g_peak.load(std::memory_order_relaxed)};
}
void set_host_alloc_observer(HostAllocObserver f) { g_observer.store(f, std::memory_order_relaxed); }
void reset_host_memory_peak() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

std::shared_ptr<ChunkedMemory> Allocator::allocate_chunked(std::size_t, Device) { return nullptr; }

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
