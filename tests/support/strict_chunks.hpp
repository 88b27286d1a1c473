#pragma once
// A host stand-in for a device's chunked memory (core/allocator.hpp), stricter
// than host pages: a chunk given back is also made inaccessible
// (mprotect PROT_NONE), so any read or write of it outside a PageLedger's
// holds ends the test with SIGSEGV, as an access to an unmapped chunk faults
// on a GPU (cuMemUnmap). Taken back, it reads as zeros, as the CUDA
// implementation's does. StrictHostAllocator hands it out for every host
// Tensor::paged(n, dt, dev) (the parameter arenas): register it first thing
// in a test binary of its own, as it replaces the host allocator for the
// whole process.
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "ringtrain/core/allocator.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain::test_support {

class StrictChunks final : public ChunkedMemory {
 public:
  explicit StrictChunks(std::size_t bytes, std::size_t chunk = host_base_page()) : chunk_(chunk) {
    bytes_ = std::max<std::size_t>(1, (bytes + chunk_ - 1) / chunk_) * chunk_;
    p_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    RT_CHECK(p_ != MAP_FAILED, "StrictChunks: mmap of ", bytes_, " bytes failed");
    resident_.assign(bytes_ / chunk_, 1);
    peak_ = bytes_;
  }
  ~StrictChunks() override { munmap(p_, bytes_); }
  void* data() const override { return p_; }
  std::size_t bytes() const override { return bytes_; }
  std::size_t chunk() const override { return chunk_; }
  void give_back(std::size_t a, std::size_t b) override {
    std::lock_guard<std::mutex> lk(mu_);
    RT_CHECK(a <= b && b <= resident_.size(), "StrictChunks: give_back of chunks [", a, ", ", b, ") of ",
             resident_.size());
    ++give_backs_;
    for (std::size_t c = a; c < b; ++c) {
      if (!resident_[c]) continue;
      void* at = static_cast<char*>(p_) + c * chunk_;
      madvise(at, chunk_, MADV_DONTNEED);
      mprotect(at, chunk_, PROT_NONE);
      resident_[c] = 0;
    }
  }
  void take_back(std::size_t a, std::size_t b) override {
    std::lock_guard<std::mutex> lk(mu_);
    RT_CHECK(a <= b && b <= resident_.size(), "StrictChunks: take_back of chunks [", a, ", ", b, ") of ",
             resident_.size());
    for (std::size_t c = a; c < b; ++c) {
      if (resident_[c]) continue;
      mprotect(static_cast<char*>(p_) + c * chunk_, chunk_, PROT_READ | PROT_WRITE);  // zeros after DONTNEED
      resident_[c] = 1;
    }
    peak_ = std::max(peak_, count() * chunk_);
  }
  std::size_t resident_bytes() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return count() * chunk_;
  }
  std::size_t peak_resident_bytes() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return peak_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lk(mu_);
    peak_ = count() * chunk_;
  }
  bool resident(std::size_t c) const {
    std::lock_guard<std::mutex> lk(mu_);
    return resident_.at(c) != 0;
  }
  std::size_t give_backs() const {
    std::lock_guard<std::mutex> lk(mu_);
    return give_backs_;
  }

 private:
  std::size_t count() const { return static_cast<std::size_t>(std::count(resident_.begin(), resident_.end(), 1)); }

  std::size_t chunk_, bytes_ = 0, peak_ = 0, give_backs_ = 0;
  void* p_ = nullptr;
  std::vector<char> resident_;
  mutable std::mutex mu_;
};

// Plain aligned host memory, but StrictChunks for Tensor::paged. Every
// chunked memory it handed out is kept listed (weakly) for the test to read.
class StrictHostAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device) override {
    if (bytes == 0) return nullptr;
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    RT_CHECK(p != nullptr, "out of host memory allocating ", bytes, " bytes");
    return p;
  }
  void deallocate(void* p, std::size_t, Device) override { std::free(p); }
  void copy(void* dst, Device, const void* src, Device, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void zero(void* p, std::size_t bytes, Device) override { std::memset(p, 0, bytes); }
  std::shared_ptr<ChunkedMemory> allocate_chunked(std::size_t bytes, Device) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto m = std::make_shared<StrictChunks>(bytes, chunk_);
    handed_.push_back(m);
    return m;
  }
  // The chunk of what it hands out from now on (a multiple of the base page;
  // a device's is 2 MiB, which a small model's buffers do not fill).
  void set_chunk(std::size_t c) {
    std::lock_guard<std::mutex> lk(mu_);
    chunk_ = c;
  }
  std::vector<std::shared_ptr<StrictChunks>> alive() {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::shared_ptr<StrictChunks>> out;
    for (auto& w : handed_)
      if (auto m = w.lock()) out.push_back(m);
    return out;
  }

 private:
  std::mutex mu_;
  std::size_t chunk_ = host_base_page();
  std::vector<std::weak_ptr<StrictChunks>> handed_;
};

}  // namespace ringtrain::test_support
