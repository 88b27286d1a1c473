#include "ringtrain/core/page_ledger.hpp"

#include <sys/mman.h>

#include <algorithm>

#include "ringtrain/core/allocator.hpp"

namespace ringtrain {

PageLedger::PageLedger(const Tensor& flat) {
  mem_ = flat.chunked_memory();
  RT_CHECK(mem_ || flat.device().is_cpu(), "PageLedger: a host buffer or chunked memory is needed (",
           flat.device().str(), ")");
  base_ = reinterpret_cast<std::uintptr_t>(flat.raw());
  elem_ = dtype_size(flat.dtype());
  chunk_ = flat.page_chunk() ? flat.page_chunk() : host_base_page();
  // Only chunks wholly inside the tensor: the bytes around it may be someone
  // else's. Tensor::paged's padding after the last element counts as its own.
  std::uintptr_t end = base_ + flat.nbytes();
  const std::uintptr_t storage_end = base_ + flat.bytes_to_storage_end();
  if (flat.page_chunk() && storage_end - end < chunk_) end = storage_end;
  first_ = (base_ + chunk_ - 1) / chunk_ * chunk_;
  end = end / chunk_ * chunk_;
  held_.assign(end > first_ ? (end - first_) / chunk_ : 0, 0);
  if (mem_) mem_first_ = (first_ - reinterpret_cast<std::uintptr_t>(mem_->data())) / chunk_;
}

std::pair<std::size_t, std::size_t> PageLedger::chunks_of(std::size_t lo, std::size_t hi) const {
  const std::uintptr_t b = base_ + lo * elem_, e = base_ + hi * elem_;
  if (e <= first_ || hi <= lo) return {0, 0};
  const std::size_t a = b <= first_ ? 0 : (b - first_) / chunk_;
  const std::size_t z = std::min(held_.size(), (e - first_ + chunk_ - 1) / chunk_);
  return {std::min(a, z), z};
}

void PageLedger::hold(std::size_t lo, std::size_t hi) {
  auto [a, z] = chunks_of(lo, hi);
  for (std::size_t c = a; c < z; ++c) ++held_[c];
  // Every time, not only for chunks no range held: a drop_all() of another
  // ledger on the same buffer (ZeRO-3's release) may have given them back.
  take_back(a, z);
}

void PageLedger::drop(std::size_t lo, std::size_t hi) {
  auto [a, z] = chunks_of(lo, hi);
  std::size_t run = z;  // the first of consecutive chunks freed by this drop
  for (std::size_t c = a; c < z; ++c) {
    const bool freed = held_[c] > 0 && --held_[c] == 0;
    if (freed && run == z) run = c;
    if (!freed && run != z) give_back(run, c), run = z;
  }
  if (run != z) give_back(run, z);
}

void PageLedger::drop_all() {
  std::fill(held_.begin(), held_.end(), 0u);
  give_back(0, held_.size());
}

void PageLedger::take_back_all() { take_back(0, held_.size()); }

std::size_t PageLedger::held_chunks() const {
  return static_cast<std::size_t>(std::count_if(held_.begin(), held_.end(), [](std::uint32_t n) { return n > 0; }));
}

void PageLedger::give_back(std::size_t a, std::size_t b) const {
  if (b <= a) return;
  if (mem_) mem_->give_back(mem_first_ + a, mem_first_ + b);
  else madvise(reinterpret_cast<void*>(first_ + a * chunk_), (b - a) * chunk_, MADV_DONTNEED);
}

void PageLedger::take_back(std::size_t a, std::size_t b) const {
  if (mem_ && b > a) mem_->take_back(mem_first_ + a, mem_first_ + b);
}

}  // namespace ringtrain
