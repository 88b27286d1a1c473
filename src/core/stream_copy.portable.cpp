// stream_copy.hpp without x86's streaming stores: a plain copy (same bytes).
#include <cstring>

#include "ringtrain/core/stream_copy.hpp"

namespace ringtrain {

void stream_copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

}  // namespace ringtrain
