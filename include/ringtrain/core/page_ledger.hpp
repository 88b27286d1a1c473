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
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ringtrain/core/tensor.hpp"

namespace ringtrain {

class PageLedger {
 public:
  PageLedger() = default;
  explicit PageLedger(const Tensor& flat);  // a host tensor; nothing held

  void hold(std::size_t lo, std::size_t hi);  // elements [lo, hi) are in use
  // Elements [lo, hi) no longer are; chunks that no range holds go back. A drop
  // of what is not held (after drop_all) is ignored.
  void drop(std::size_t lo, std::size_t hi);
  void drop_all();  // forget every hold and give every chunk back

  std::size_t chunk_bytes() const { return chunk_; }
  std::size_t held_chunks() const;

 private:
  std::pair<std::size_t, std::size_t> chunks_of(std::size_t lo, std::size_t hi) const;
  void give_back(std::size_t a, std::size_t b) const;  // chunks [a, b)

  std::uintptr_t base_ = 0, first_ = 0;  // the buffer, and its first managed chunk
  std::size_t elem_ = 1, chunk_ = 0;
  std::vector<std::uint32_t> held_;  // per managed chunk: ranges holding it
};

}  // namespace ringtrain
