#pragma once
// The fusion engine's byte movers on the GPU (engine/fusion_ops.hpp) and a
// batched pack/unpack: many tensors <-> one fusion buffer in one kernel launch
// from a device-side table of (src, dst, bytes) entries.
//
// Rules: everything is enqueued on the context's comm stream (the engine's
// thread owns it); synchronize() waits for that stream only. The gradients
// being packed were produced on the compute stream: the engine calls
// wait_for_producers() (an event, no host wait) before packing them.
#include <memory>
#include <vector>

#include "ringtrain/cuda/context.hpp"
#include "ringtrain/cuda/kernels.hpp"
#include "ringtrain/cuda/memory.hpp"
#include "ringtrain/engine/fusion_ops.hpp"

namespace ringtrain::cuda {

// A reusable table for batched_copy: upload() copies the entries through a
// pinned mirror into device memory (both grow only), then run() launches once.
class CopyPlan {
 public:
  explicit CopyPlan(int device) : device_(device) {}
  ~CopyPlan();
  CopyPlan(const CopyPlan&) = delete;
  CopyPlan& operator=(const CopyPlan&) = delete;
  void upload(const std::vector<CopyEntry>& entries, cudaStream_t s);
  void run(cudaStream_t s) const;
  std::size_t entries() const { return n_; }

 private:
  int device_;
  PinnedBuffer host_;
  CopyEntry* dev_ = nullptr;
  std::size_t cap_ = 0, n_ = 0, total_ = 0;
};

class CudaFusionOps final : public FusionOps {
 public:
  explicit CudaFusionOps(CudaContext& ctx) : ctx_(ctx), plan_(ctx.device_index()) {}
  void pack(void* dst, const void* src, std::size_t bytes, Device dev) override;
  void unpack(void* dst, const void* src, std::size_t bytes, Device dev) override;
  // One batched_copy launch for the whole fusion buffer (CopyPlan).
  void pack_many(std::span<const CopySpan> spans, Device dev) override;
  void unpack_many(std::span<const CopySpan> spans, Device dev) override;
  void scale(void* buf, std::size_t count, DType dt, double factor, Device dev) override;
  void compress_f16(void* dst_f16, const void* src, std::size_t count, DType src_dt, Device dev) override;
  void decompress_f16(void* dst, const void* src_f16, std::size_t count, DType dst_dt, double factor,
                      Device dev) override;
  void synchronize(Device dev) override;
  // On the engine thread: binds it to the context's device and makes the comm
  // stream wait for the compute stream's work queued so far (the gradients).
  void wait_for_producers(Device dev) override;

 private:
  void check(Device dev, const char* what) const;
  void copy_many(std::span<const CopySpan> spans, Device dev, const char* what);
  CudaContext& ctx_;
  CopyPlan plan_;
  std::vector<CopyEntry> entries_;
};

std::shared_ptr<FusionOps> make_fusion_ops(CudaContext& ctx);

}  // namespace ringtrain::cuda
