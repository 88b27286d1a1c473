// stream_copy against memcpy: every size around the 64-byte line and the
// 16 KiB four-page block, at every destination and source misalignment.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "ringtrain/core/stream_copy.hpp"

using ringtrain::stream_copy;

TEST(StreamCopy, EqualsMemcpyAtEverySizeAndAlignment) {
  const std::size_t max = 3 * 16384 + 200;
  std::vector<unsigned char> src(max + 128), dst(max + 128), want(max + 128);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  const std::vector<std::size_t> sizes = {0, 1, 63, 64, 65, 4095, 16383, 16384, 16385, 16384 + 64 * 3 + 5,
                                          2 * 16384 - 1, max};
  for (std::size_t n : sizes)
    for (std::size_t da : {0, 1, 17, 63})
      for (std::size_t sa : {0, 5, 32}) {
        std::fill(dst.begin(), dst.end(), 0xee);
        want = dst;
        std::memcpy(want.data() + da, src.data() + sa, n);
        stream_copy(dst.data() + da, src.data() + sa, n);
        ASSERT_EQ(dst, want) << "size " << n << ", destination offset " << da << ", source offset " << sa;
      }
}

TEST(StreamCopy, CopiesALargeBufferExactly) {
  std::vector<std::uint32_t> src(25'000'000 / 4 + 3), dst(src.size(), 0);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint32_t>(i * 2654435761u);
  stream_copy(dst.data(), src.data(), src.size() * 4);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), src.size() * 4), 0);
}
