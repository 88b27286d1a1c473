// PageLedger and Tensor::paged against the kernel's own account of which pages
// are resident (mincore) and against the bytes written: a chunk goes back only
// once no held range overlaps it, and bytes outside a tensor's storage (or in
// a chunk still held) are never touched. The host allocation observer sees
// each allocation and release once, with the bytes host_memory_stats counts.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "ringtrain/core/allocator.hpp"
#include "ringtrain/core/page_ledger.hpp"
#include "ringtrain/core/tensor.hpp"

using namespace ringtrain;

namespace {

// Resident base pages of [p, p + bytes) (p page-aligned), by mincore.
std::size_t resident_pages(const void* p, std::size_t bytes) {
  const std::size_t page = host_base_page(), n = (bytes + page - 1) / page;
  std::vector<unsigned char> v(n);
  EXPECT_EQ(mincore(const_cast<void*>(p), bytes, v.data()), 0);
  std::size_t r = 0;
  for (unsigned char c : v) r += c & 1;
  return r;
}

bool all_bytes(const unsigned char* p, std::size_t n, unsigned char v) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != v) return false;
  return true;
}

// What the observer saw (it is a plain function pointer: no state of its own).
std::vector<std::tuple<const void*, std::size_t, bool>>* g_seen = nullptr;
void record(const void* p, std::size_t bytes, bool allocated) {
  if (g_seen) g_seen->emplace_back(p, bytes, allocated);
}

}  // namespace

TEST(HostAllocObserver, SeesEachAllocationAndReleaseWithItsBytes) {
  std::vector<std::tuple<const void*, std::size_t, bool>> seen;
  g_seen = &seen;
  set_host_alloc_observer(&record);
  const std::size_t live0 = host_memory_stats().live;
  const void *tensor = nullptr, *pages = nullptr;
  {
    Tensor t = Tensor::empty({3, 5}, DType::f32);
    tensor = t.raw();
    EXPECT_EQ(host_memory_stats().live - live0, 60u);
    HostPages hp = allocate_host_pages(5000);
    pages = hp.data;
    EXPECT_EQ(host_memory_stats().live - live0, 5060u);
    free_host_pages(hp);
  }
  set_host_alloc_observer(nullptr);
  g_seen = nullptr;
  Tensor after = Tensor::empty({4}, DType::f32);  // not observed
  EXPECT_EQ(host_memory_stats().live - live0, 16u);
  using Event = std::tuple<const void*, std::size_t, bool>;
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0], Event(tensor, 60, true));
  EXPECT_EQ(seen[1], Event(pages, 5000, true));
  EXPECT_EQ(seen[2], Event(pages, 5000, false));
  EXPECT_EQ(seen[3], Event(tensor, 60, false));
}

TEST(HostPages, PagedTensorIsZeroAlignedAndWholeChunks) {
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{300000}, std::int64_t{1} << 20}) {
    Tensor t = Tensor::paged(n, DType::f32);
    const std::size_t chunk = t.page_chunk();
    ASSERT_GT(chunk, 0u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw()) % chunk, 0u) << n;
    EXPECT_EQ(t.bytes_to_storage_end() % chunk, 0u) << n;
    EXPECT_GE(t.bytes_to_storage_end(), t.nbytes());
    EXPECT_TRUE(all_bytes(static_cast<const unsigned char*>(t.raw()), t.nbytes(), 0)) << n;
    // Huge pages only for buffers of at least half of one, where the kernel has them.
    if (host_huge_page() && t.nbytes() >= host_huge_page() / 2) EXPECT_EQ(chunk, host_huge_page()) << n;
    else EXPECT_EQ(chunk, host_base_page()) << n;
  }
}

TEST(PageLedger, GivesAChunkBackOnlyWhenNoHeldRangeOverlapsIt) {
  // Four chunks of floats; ranges cut inside chunks, as buckets cut at layers.
  // Residency is checked before reading: a read of a chunk given back maps the
  // kernel's zero page, which mincore counts.
  const std::size_t chunk_guess = host_huge_page() ? host_huge_page() : host_base_page();
  const std::int64_t n = static_cast<std::int64_t>(4 * chunk_guess / 4);
  Tensor t = Tensor::paged(n, DType::f32);
  const std::size_t chunk = t.page_chunk(), per = chunk / 4;  // floats per chunk
  auto* bytes = static_cast<unsigned char*>(t.raw());
  std::memset(bytes, 0x5a, t.nbytes());
  ASSERT_EQ(resident_pages(bytes, t.nbytes()), t.nbytes() / host_base_page());

  PageLedger led(t);
  EXPECT_EQ(led.chunk_bytes(), chunk);
  // A = [0, 1.5 chunks), B = [1.5, 3 chunks), C = [3 chunks, end).
  const std::size_t a = 0, b = per + per / 2, c = 3 * per, e = static_cast<std::size_t>(n);
  led.hold(a, b);
  led.hold(b, c);
  led.hold(c, e);
  EXPECT_EQ(led.held_chunks(), 4u);

  led.drop(a, b);  // chunk 0 is A's alone; chunk 1 is shared with B
  EXPECT_EQ(resident_pages(bytes, chunk), 0u);
  EXPECT_TRUE(all_bytes(bytes, chunk, 0));
  EXPECT_TRUE(all_bytes(bytes + chunk, 3 * chunk, 0x5a)) << "a chunk B still holds was given back";

  led.drop(c, e);  // chunk 3
  EXPECT_EQ(resident_pages(bytes + 3 * chunk, chunk), 0u);
  EXPECT_TRUE(all_bytes(bytes + 3 * chunk, chunk, 0));
  EXPECT_TRUE(all_bytes(bytes + chunk, 2 * chunk, 0x5a));

  led.drop(b, c);  // chunks 1 and 2 now (reading a chunk given back maps the zero page: check first)
  EXPECT_EQ(led.held_chunks(), 0u);
  EXPECT_EQ(resident_pages(bytes + chunk, 2 * chunk), 0u);
  EXPECT_TRUE(all_bytes(bytes, t.nbytes(), 0));

  // A drop of what is not held does nothing: written bytes stay.
  std::memset(bytes, 0x11, chunk);
  led.drop(a, per);
  EXPECT_TRUE(all_bytes(bytes, chunk, 0x11));
  // drop_all forgets the holds and gives everything back.
  led.hold(a, e);
  led.drop_all();
  EXPECT_EQ(led.held_chunks(), 0u);
  EXPECT_TRUE(all_bytes(bytes, chunk, 0));
}

TEST(PageLedger, NeverTouchesBytesOutsideTheTensorsStorage) {
  // An ordinary tensor's view in the middle of a larger one: only base pages
  // wholly inside the view may go back; the larger tensor's bytes before and
  // after it must survive.
  const std::size_t page = host_base_page();
  Tensor big = Tensor::empty({static_cast<std::int64_t>(8 * page)}, DType::u8);
  auto* all = static_cast<unsigned char*>(big.raw());
  std::memset(all, 0x77, big.nbytes());
  const std::size_t off = page / 2 + 3;  // not page-aligned
  Tensor view = big.flat_view(static_cast<std::int64_t>(off), static_cast<std::int64_t>(4 * page));
  PageLedger led(view);
  EXPECT_EQ(led.chunk_bytes(), page);
  led.hold(0, 4 * page);
  led.drop(0, 4 * page);
  // Bytes before the first whole page of the view are intact.
  const auto base = reinterpret_cast<std::uintptr_t>(all) + off;
  const std::size_t head = (base + page - 1) / page * page - reinterpret_cast<std::uintptr_t>(all);
  EXPECT_TRUE(all_bytes(all, head, 0x77));
  // Whole pages of the view's range went back (read as zeros); the bytes after
  // its last whole page, in it or after it, are intact.
  const std::size_t last_whole = (base + 4 * page) / page * page - reinterpret_cast<std::uintptr_t>(all);
  EXPECT_TRUE(all_bytes(all + head, last_whole - head, 0));
  EXPECT_TRUE(all_bytes(all + last_whole, big.nbytes() - last_whole, 0x77));
}
