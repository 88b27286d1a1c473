#pragma once
// Fusion buffer manager and batch planning.
//
// Rules: a batch holds tensors of one wire dtype, one reduce op and one device
// kind, packed back to back, at most `threshold` bytes on the wire (a tensor
// larger than the threshold forms a batch of its own). plan_batches() depends
// only on the ordered ops' signatures and the settings every rank shares, so
// all ranks cut identical batches and issue identical collectives. The buffer
// of each device is allocated once and only grows (to the largest batch seen,
// rounded up to a power of two, capped at max(threshold, that batch)).
#include <cstddef>
#include <map>
#include <vector>

#include "ringtrain/core/device.hpp"
#include "ringtrain/core/dtype.hpp"
#include "tensor_queue.hpp"

namespace ringtrain::engine {

struct Batch {
  std::vector<OpPtr> ops;
  DType wire = DType::f32;  // dtype on the wire (f16 when compressed)
  ReduceOp op = ReduceOp::sum;
  DeviceKind device = DeviceKind::cpu;
  bool compressed = false;  // f32/f64 tensors converted to f16
  std::size_t count = 0;    // elements
  std::size_t bytes() const { return count * dtype_size(wire); }
};

// Whether `dt` travels as float16 under fp16 compression.
inline bool compresses(DType dt, bool fp16) { return fp16 && (dt == DType::f32 || dt == DType::f64); }

// Stable grouping by (wire dtype, op, device kind) in order of first
// appearance, then cut into batches of at most `threshold` wire bytes.
std::vector<Batch> plan_batches(const std::vector<OpPtr>& ordered, std::size_t threshold, bool fp16);

class FusionBufferManager {
 public:
  FusionBufferManager() = default;
  ~FusionBufferManager();
  FusionBufferManager(const FusionBufferManager&) = delete;
  FusionBufferManager& operator=(const FusionBufferManager&) = delete;

  // A buffer of at least `bytes` on `dev` (valid until the next get for that device).
  void* get(Device dev, std::size_t bytes, std::size_t threshold);
  std::size_t capacity(Device dev) const;

 private:
  struct Buf {
    void* ptr = nullptr;
    std::size_t bytes = 0;
    Device dev;
  };
  std::map<std::pair<int, int>, Buf> bufs_;  // (kind, index)
};

}  // namespace ringtrain::engine
