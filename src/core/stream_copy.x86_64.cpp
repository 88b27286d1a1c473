#include "ringtrain/core/stream_copy.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace ringtrain {
namespace {

// One 64-byte line from s to d, bypassing the cache on the store side (SSE2: every x86-64).
inline void stream_line(char* d, const char* s) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
  const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
  _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
}

}  // namespace

void stream_copy(void* dst, const void* src, std::size_t bytes) {
  constexpr std::size_t kLine = 64, kPage = 4096, kBlock = 4 * kPage;
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  if (bytes < kBlock) {
    std::memcpy(d, s, bytes);
    return;
  }
  // The destination line-aligned, so every streamed store fills whole lines.
  const std::size_t head = (kLine - reinterpret_cast<std::uintptr_t>(d) % kLine) % kLine;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  // A line of each of four pages in turn: four DRAM pages stream at once (as glibc's largest copies).
  for (; bytes >= kBlock; bytes -= kBlock, d += kBlock, s += kBlock)
    for (std::size_t off = 0; off < kPage; off += kLine)
      for (std::size_t p = 0; p < 4; ++p) stream_line(d + p * kPage + off, s + p * kPage + off);
  for (; bytes >= kLine; bytes -= kLine, d += kLine, s += kLine) stream_line(d, s);
  _mm_sfence();  // the streamed stores are visible before anyone is told the copy is done
  std::memcpy(d, s, bytes);
}

}  // namespace ringtrain
