#pragma once
// ZeRO-2/3 on device buffers: the full gradient and parameter buffers of a
// device arena as a reserved virtual address range whose physical chunks are
// mapped only while a PageLedger holds them (core/page_ledger.hpp), the way
// PyTorch's expandable segments grow and shrink: cuMemAddressReserve once,
// then per chunk cuMemCreate + cuMemMap + cuMemSetAccess to take it back and
// cuMemUnmap + cuMemRelease to give it back. The chunk is the driver's minimum
// granularity (cuMemGetAllocationGranularity; 2 MiB on current GPUs).
//
// Rules kept here:
//  - The driver API is resolved through the runtime (cudaGetDriverEntryPointByVersion),
//    as nothing else in the module links libcuda: the build machine has no driver.
//  - A chunk taken back is zeroed before take_back returns (host pages given
//    back read as zeros too; ZeRO-2's reduce-scatters read the padding).
//  - give_back waits for the device (cudaDeviceSynchronize) before unmapping:
//    unmapping does not wait for kernels still using the chunk.
//  - A device without virtual memory management fails the allocation with an
//    error naming it; nothing falls back silently.
//  - Thread-safe (a mutex): ZeRO's worker gives back, the main thread takes back.
#include <cstddef>
#include <memory>

#include "ringtrain/core/allocator.hpp"

namespace ringtrain::cuda {

// Chunked memory of at least `bytes` on CUDA device `device`, wholly resident and zeroed.
std::shared_ptr<ChunkedMemory> make_chunked_memory(std::size_t bytes, int device);

}  // namespace ringtrain::cuda
