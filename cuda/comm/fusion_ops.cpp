#include "ringtrain/cuda/fusion.hpp"

#include <cmath>

#include "ringtrain/cuda/check.hpp"

namespace ringtrain::cuda {

CopyPlan::~CopyPlan() {
  if (dev_) device_allocator().deallocate(dev_, cap_ * sizeof(CopyEntry), Device::cuda(device_));
}

void CopyPlan::upload(const std::vector<CopyEntry>& entries, cudaStream_t s) {
  std::size_t n = entries.size(), bytes = n * sizeof(CopyEntry);
  if (n > cap_) {
    RT_CUDA(cudaStreamSynchronize(s));  // the old table may still be read
    if (dev_) device_allocator().deallocate(dev_, cap_ * sizeof(CopyEntry), Device::cuda(device_));
    dev_ = static_cast<CopyEntry*>(device_allocator().allocate(bytes, Device::cuda(device_)));
    cap_ = n;
  } else {
    RT_CUDA(cudaStreamSynchronize(s));  // the pinned mirror may still be read by the last upload
  }
  host_.reserve(bytes);
  total_ = 0;
  for (std::size_t i = 0; i < n; ++i) {
    host_.as<CopyEntry>()[i] = entries[i];
    total_ += entries[i].bytes;
  }
  n_ = n;
  if (bytes) RT_CUDA(cudaMemcpyAsync(dev_, host_.data(), bytes, cudaMemcpyHostToDevice, s));
}

void CopyPlan::run(cudaStream_t s) const { batched_copy(dev_, static_cast<int>(n_), total_, s); }

void CudaFusionOps::check(Device dev, const char* what) const {
  RT_CHECK(dev.is_cuda() && dev.index == ctx_.device_index(), "CUDA fusion ops (", what, "): buffer on ", dev.str(),
           ", this context serves cuda:", ctx_.device_index());
}

void CudaFusionOps::pack(void* dst, const void* src, std::size_t bytes, Device dev) {
  check(dev, "pack");
  if (bytes) RT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx_.comm()));
}

void CudaFusionOps::unpack(void* dst, const void* src, std::size_t bytes, Device dev) {
  check(dev, "unpack");
  if (bytes) RT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx_.comm()));
}

void CudaFusionOps::copy_many(std::span<const CopySpan> spans, Device dev, const char* what) {
  check(dev, what);
  entries_.clear();
  for (const auto& c : spans)
    if (c.bytes) entries_.push_back({c.src, c.dst, c.bytes});
  if (entries_.empty()) return;
  plan_.upload(entries_, ctx_.comm());
  plan_.run(ctx_.comm());
}

void CudaFusionOps::pack_many(std::span<const CopySpan> spans, Device dev) { copy_many(spans, dev, "pack_many"); }
void CudaFusionOps::unpack_many(std::span<const CopySpan> spans, Device dev) { copy_many(spans, dev, "unpack_many"); }

void CudaFusionOps::scale(void* buf, std::size_t count, DType dt, double factor, Device dev) {
  check(dev, "scale");
  if (is_floating(dt)) {
    cuda::scale(buf, count, dt, factor, ctx_.comm());
  } else {
    // Integers divide by round(1/factor) (the FusionOps contract).
    int d = static_cast<int>(std::lround(1.0 / factor));
    RT_CHECK(d >= 1, "CUDA fusion ops: integer scale factor ", factor, " is not 1/k");
    cuda::divide(buf, count, dt, d, ctx_.comm());
  }
}

void CudaFusionOps::compress_f16(void* dst, const void* src, std::size_t count, DType src_dt, Device dev) {
  check(dev, "compress_f16");
  cuda::cast(dst, DType::f16, src, src_dt, count, ctx_.comm());
}

void CudaFusionOps::decompress_f16(void* dst, const void* src, std::size_t count, DType dst_dt, double factor,
                                   Device dev) {
  check(dev, "decompress_f16");
  cuda::cast(dst, dst_dt, src, DType::f16, count, ctx_.comm());
  if (factor != 1.0) cuda::scale(dst, count, dst_dt, factor, ctx_.comm());
}

void CudaFusionOps::wait_for_producers(Device dev) {
  check(dev, "wait_for_producers");
  ctx_.make_current();
  ctx_.stream_wait(ctx_.comm(), ctx_.compute());
}

void CudaFusionOps::synchronize(Device dev) {
  check(dev, "synchronize");
  RT_CUDA(cudaStreamSynchronize(ctx_.comm()));
}

std::shared_ptr<FusionOps> make_fusion_ops(CudaContext& ctx) { return std::make_shared<CudaFusionOps>(ctx); }

}  // namespace ringtrain::cuda
