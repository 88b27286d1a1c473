#pragma once
// Host copies of large buffers that are not read again soon (checkpoint
// snapshots: the background writer reads them later) with non-temporal
// stores, four pages at a time. glibc's memcpy picks this only above a size
// derived from the L3 size the machine reports (hundreds of MB on some
// VMs), so a 100 MB copy ran 1.6x slower than the same bytes in one call.
// Off x86-64 (stream_copy.portable.cpp) it is memcpy.
#include <cstddef>

namespace ringtrain {

void stream_copy(void* dst, const void* src, std::size_t bytes);

}  // namespace ringtrain
