#pragma once
// FusionOps: the device-specific byte movers of the fusion engine. The engine
// itself never touches tensor memory directly: it packs tensors into the
// fusion buffer, scales, converts for fp16 compression and unpacks only through
// this interface, so the CUDA backend supplies kernels (and a stream sync) and
// the CPU path is memcpy and simple loops.
//
// Rules: every call is synchronous from the engine's point of view (after
// synchronize(dev) the data is visible to the collectives); `count` is in
// elements; pointers live on `dev`. Implementations must be deterministic so
// all ranks produce bitwise-identical results from identical inputs.
#include <cstddef>
#include <memory>
#include <span>

#include "ringtrain/core/device.hpp"
#include "ringtrain/core/dtype.hpp"

namespace ringtrain {

// One tensor's bytes in a batch copy into or out of the fusion buffer.
struct CopySpan {
  void* dst;
  const void* src;
  std::size_t bytes;
};

class FusionOps {
 public:
  virtual ~FusionOps() = default;
  // dst <- src, `bytes` bytes (tensor -> fusion buffer).
  virtual void pack(void* dst, const void* src, std::size_t bytes, Device dev) = 0;
  // dst <- src, `bytes` bytes (fusion buffer -> tensor).
  virtual void unpack(void* dst, const void* src, std::size_t bytes, Device dev) = 0;
  // A whole fusion buffer's tensors at once (a device does it in one kernel
  // launch); the default calls pack()/unpack() per span.
  virtual void pack_many(std::span<const CopySpan> spans, Device dev) {
    for (const auto& c : spans) pack(c.dst, c.src, c.bytes, dev);
  }
  virtual void unpack_many(std::span<const CopySpan> spans, Device dev) {
    for (const auto& c : spans) unpack(c.dst, c.src, c.bytes, dev);
  }
  // buf[i] *= factor for `count` elements of `dt` (averaging). Floating types
  // multiply in float32 (float64 for f64); integer types divide by round(1/factor).
  virtual void scale(void* buf, std::size_t count, DType dt, double factor, Device dev) = 0;
  // fp16 compression: dst_f16[i] = to_f16(src[i]) for src of dtype `src_dt` (f32 or f64).
  virtual void compress_f16(void* dst_f16, const void* src, std::size_t count, DType src_dt, Device dev) = 0;
  // dst[i] = to_f32(src_f16[i]) * factor, stored as `dst_dt` (f32 or f64).
  virtual void decompress_f16(void* dst, const void* src_f16, std::size_t count, DType dst_dt,
                              double factor, Device dev) = 0;
  // Waits until the work queued above is finished (CPU: nothing to do).
  virtual void synchronize(Device dev) {}
  // Called on the engine thread before a batch's tensors are read (packed, or
  // reduced in their own memory): a device backend orders its copy stream
  // after the work that produced them, e.g. an event wait on the compute
  // stream (CPU: nothing to do).
  virtual void wait_for_producers(Device dev) {}
};

// The built-in host implementation (memcpy, loops).
std::shared_ptr<FusionOps> cpu_fusion_ops();

}  // namespace ringtrain
