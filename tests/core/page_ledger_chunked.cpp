// The PageLedger on chunked memory (a device's: CUDA virtual memory, here its
// strict host stand-in, tests/support/strict_chunks.hpp): the same ledger
// algorithm as for host pages (page_ledger.cpp's tests), with the memory's
// give-back and take-back. A chunk goes back once no held range overlaps it,
// comes back zeroed on the next hold of any range over it, a hold takes back
// what another ledger gave back (ZeRO-3's release), take_back_all maps the
// whole buffer, and chunks not wholly inside a view are never touched. A read
// of a chunk that should have been taken back would end this test with SIGSEGV.
// Its own binary: it replaces the host allocator for the whole process.
#include <gtest/gtest.h>

#include <cstring>

#include "ringtrain/core/page_ledger.hpp"
#include "ringtrain/core/tensor.hpp"
#include "support/strict_chunks.hpp"

using namespace ringtrain;
using test_support::StrictChunks;
using test_support::StrictHostAllocator;

namespace {

bool all_bytes(const unsigned char* p, std::size_t n, unsigned char v) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != v) return false;
  return true;
}

StrictChunks& memory_of(const Tensor& t) {
  auto* m = dynamic_cast<StrictChunks*>(t.chunked_memory());
  EXPECT_NE(m, nullptr) << "Tensor::paged did not take the allocator's chunked memory";
  return *m;
}

class ChunkedLedger : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { register_allocator(DeviceKind::cpu, std::make_unique<StrictHostAllocator>()); }
};

}  // namespace

TEST_F(ChunkedLedger, TakesBackOnHoldGivesBackOnTheLastDropAndReadsZeros) {
  const std::size_t page = host_base_page(), per = page / 4;  // floats per chunk
  Tensor t = Tensor::paged(static_cast<std::int64_t>(4 * per), DType::f32, Device::cpu());
  StrictChunks& m = memory_of(t);
  ASSERT_EQ(t.page_chunk(), page);
  ASSERT_EQ(m.resident_bytes(), 4 * page) << "chunked memory starts resident";
  auto* bytes = static_cast<unsigned char*>(t.raw());
  EXPECT_TRUE(all_bytes(bytes, t.nbytes(), 0)) << "and zeroed";
  std::memset(bytes, 0x5a, t.nbytes());

  PageLedger led(t);
  EXPECT_EQ(led.chunk_bytes(), page);
  // A = [0, 1.5 chunks), B = [1.5, 3), C = [3, 4): buckets cut inside chunks.
  const std::size_t a = 0, b = per + per / 2, c = 3 * per, e = 4 * per;
  led.hold(a, b);
  led.hold(b, c);
  led.hold(c, e);
  EXPECT_EQ(m.resident_bytes(), 4 * page);
  led.drop(a, b);  // chunk 0 is A's alone, chunk 1 shared with B
  EXPECT_FALSE(m.resident(0));
  EXPECT_TRUE(m.resident(1)) << "a chunk B still holds was given back";
  EXPECT_TRUE(all_bytes(bytes + page, 3 * page, 0x5a));
  led.drop(b, c);
  EXPECT_FALSE(m.resident(1));
  EXPECT_FALSE(m.resident(2));
  EXPECT_EQ(m.resident_bytes(), page);
  EXPECT_EQ(m.peak_resident_bytes(), 4 * page);

  // Held again: taken back, and what was given back reads as zeros (ZeRO-2's
  // reduce-scatters read the padding no backward writes); chunk 3, never
  // given back, keeps its bytes.
  m.reset_peak();
  led.hold(a, c);
  EXPECT_EQ(m.resident_bytes(), 4 * page);
  EXPECT_TRUE(all_bytes(bytes, 3 * page, 0));
  EXPECT_TRUE(all_bytes(bytes + 3 * page, page, 0x5a));
  EXPECT_EQ(m.peak_resident_bytes(), 4 * page);

  // Another ledger gives everything back (ZeRO-3's release of the whole
  // buffer) while this one still counts holds: the next hold takes them back.
  PageLedger(t).drop_all();
  EXPECT_EQ(m.resident_bytes(), 0u);
  led.hold(c, e);  // chunk 3 only
  EXPECT_EQ(m.resident_bytes(), page);
  EXPECT_TRUE(all_bytes(bytes + 3 * page, page, 0));
  led.hold(a, per);  // chunk 0, held twice now
  EXPECT_TRUE(m.resident(0));

  // take_back_all: the whole buffer resident, holds unchanged (ZeRO-3's materialize).
  PageLedger(t).take_back_all();
  EXPECT_EQ(m.resident_bytes(), 4 * page);
  std::memset(bytes, 0x33, t.nbytes());
  // drop_all forgets every hold: all goes back; a drop of what is not held does nothing.
  led.drop_all();
  EXPECT_EQ(led.held_chunks(), 0u);
  EXPECT_EQ(m.resident_bytes(), 0u);
  const std::size_t gives = m.give_backs();
  led.drop(a, e);
  EXPECT_EQ(m.give_backs(), gives);
}

TEST_F(ChunkedLedger, NeverGivesBackAChunkNotWhollyInsideTheView) {
  // A view from the middle of chunk 0 to the middle of chunk 6: chunks 1-5 are
  // its own; chunks 0 and 6 hold bytes of the rest of the buffer.
  const std::size_t page = host_base_page();
  Tensor big = Tensor::paged(static_cast<std::int64_t>(8 * page), DType::u8, Device::cpu());
  StrictChunks& m = memory_of(big);
  auto* all = static_cast<unsigned char*>(big.raw());
  std::memset(all, 0x77, big.nbytes());
  const std::size_t off = page / 2 + 3;
  Tensor view = big.flat_view(static_cast<std::int64_t>(off), static_cast<std::int64_t>(6 * page));
  PageLedger led(view);
  led.hold(0, 6 * page);
  led.drop(0, 6 * page);
  EXPECT_TRUE(m.resident(0));
  for (std::size_t c = 1; c < 6; ++c) EXPECT_FALSE(m.resident(c)) << "chunk " << c;
  EXPECT_TRUE(m.resident(6));
  EXPECT_TRUE(m.resident(7));
  EXPECT_TRUE(all_bytes(all, page, 0x77));
  EXPECT_TRUE(all_bytes(all + 6 * page, 2 * page, 0x77));
}

TEST_F(ChunkedLedger, AnotherDevicesTensorWithoutChunkedMemoryIsRefusedByName) {
  // A plain (non-chunked) tensor claiming a device: the ledger cannot give its memory back.
  float x[4] = {};
  Tensor t = Tensor::wrap(x, {4}, DType::f32, Device{DeviceKind::cuda, 0});
  try {
    PageLedger led(t);
    FAIL() << "a device tensor without chunked memory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chunked memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}
