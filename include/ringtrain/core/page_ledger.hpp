#pragma once
// Which pages of a flat host buffer hold data someone still needs, and handing
// the others back to the system (madvise DONTNEED: they read as zeros and cost
// no memory until written again). ZeRO-2/3 hold a bucket's range of the full
// gradient or parameter buffer while it is in use and drop it after; a page
// chunk goes back once no held range overlaps it, so ranges that share a chunk
// (buckets are cut at layers, not at pages) give it back together.
//
// Chunks are the buffer's page chunk (Tensor::paged: whole transparent huge
// pages where the kernel has them, so faulting a chunk back in costs one fault)
// or, for any other buffer, the base pages; only chunks wholly inside the
// tensor (and Tensor::paged's padding after it) are ever given back. Not
// thread-safe: one thread holds and drops, or the caller orders them.
//
// One algorithm (which chunks how many held ranges cover) for host and device;
// what giving back and taking back do is the memory's (core/allocator.hpp):
//  - a host buffer: madvise(DONTNEED); taking back is nothing, since a page
//    given back faults in again as zeros when written or read;
//  - chunked memory (Tensor::paged on a device, ChunkedMemory): unmapped, and
//    mapped again on hold(), zeroed, so that it too reads as zeros. ZeRO-2
//    relies on that: its reduce-scatters read the padding between parameters,
//    which no backward writes. An access outside held chunks faults there.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ringtrain/core/tensor.hpp"

namespace ringtrain {

class PageLedger {
 public:
  PageLedger() = default;
  // A host tensor, or any tensor on chunked memory; nothing held.
  explicit PageLedger(const Tensor& flat);

  // Elements [lo, hi) are in use: their chunks are resident (taken back where
  // they were given back) until the last range holding them is dropped.
  void hold(std::size_t lo, std::size_t hi);
  // Elements [lo, hi) no longer are; chunks that no range holds go back. A drop
  // of what is not held (after drop_all) is ignored.
  void drop(std::size_t lo, std::size_t hi);
  void drop_all();  // forget every hold and give every chunk back
  // Every chunk resident (holds unchanged): before a use of the whole buffer
  // (ZeRO-3's materialize). Nothing to do on the host.
  void take_back_all();

  std::size_t chunk_bytes() const { return chunk_; }
  std::size_t held_chunks() const;

 private:
  std::pair<std::size_t, std::size_t> chunks_of(std::size_t lo, std::size_t hi) const;
  void give_back(std::size_t a, std::size_t b) const;  // chunks [a, b)
  void take_back(std::size_t a, std::size_t b) const;

  ChunkedMemory* mem_ = nullptr;         // null: host pages (madvise)
  std::size_t mem_first_ = 0;            // mem_'s index of the first managed chunk
  std::uintptr_t base_ = 0, first_ = 0;  // the buffer, and its first managed chunk
  std::size_t elem_ = 1, chunk_ = 0;
  std::vector<std::uint32_t> held_;  // per managed chunk: ranges holding it
};

}  // namespace ringtrain
