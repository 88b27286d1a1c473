#include "fusion_buffer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "ringtrain/core/allocator.hpp"
#include "ringtrain/engine/fusion_ops.hpp"

namespace ringtrain::engine {

std::vector<Batch> plan_batches(const std::vector<OpPtr>& ordered, std::size_t threshold, bool fp16) {
  using Key = std::tuple<DType, ReduceOp, DeviceKind>;
  std::vector<std::pair<Key, std::vector<OpPtr>>> groups;
  for (const auto& op : ordered) {
    const auto& s = op->sig;
    Key k{compresses(s.dtype, fp16) ? DType::f16 : s.dtype, s.op, s.device};
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == k; });
    if (it == groups.end()) groups.push_back({k, {op}});
    else it->second.push_back(op);
  }
  std::vector<Batch> out;
  for (auto& [key, ops] : groups) {
    Batch cur;
    for (auto& op : ops) {
      std::size_t n = static_cast<std::size_t>(op->input.numel());
      std::size_t add = n * dtype_size(std::get<0>(key));
      if (!cur.ops.empty() && cur.bytes() + add > threshold) {
        out.push_back(std::move(cur));
        cur = Batch{};
      }
      if (cur.ops.empty()) {
        cur.wire = std::get<0>(key);
        cur.op = std::get<1>(key);
        cur.device = std::get<2>(key);
        cur.compressed = compresses(op->sig.dtype, fp16);
      }
      cur.ops.push_back(op);
      cur.count += n;
    }
    if (!cur.ops.empty()) out.push_back(std::move(cur));
  }
  return out;
}

FusionBufferManager::~FusionBufferManager() {
  for (auto& [k, b] : bufs_)
    if (b.ptr) allocator_for(b.dev.kind).deallocate(b.ptr, b.bytes, b.dev);
}

void* FusionBufferManager::get(Device dev, std::size_t bytes, std::size_t threshold) {
  Buf& b = bufs_[{static_cast<int>(dev.kind), dev.index}];
  if (b.bytes >= bytes && b.ptr) return b.ptr;
  std::size_t want = 4096;
  while (want < bytes) want *= 2;
  want = std::max(bytes, std::min(want, std::max(threshold, bytes)));
  if (b.ptr) allocator_for(b.dev.kind).deallocate(b.ptr, b.bytes, b.dev);
  b.ptr = nullptr;
  b.dev = dev;
  b.ptr = allocator_for(dev.kind).allocate(want, dev);
  b.bytes = want;
  return b.ptr;
}

std::size_t FusionBufferManager::capacity(Device dev) const {
  auto it = bufs_.find({static_cast<int>(dev.kind), dev.index});
  return it == bufs_.end() ? 0 : it->second.bytes;
}

}  // namespace ringtrain::engine

// ---- the host FusionOps ------------------------------------------------------
namespace ringtrain {
namespace {

template <typename T>
void scale_loop(T* p, std::size_t n, double factor) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    float f = static_cast<float>(factor);
    for (std::size_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, float16>) p[i] = to_f16(to_f32(p[i]) * f);
      else p[i] = to_bf16(to_f32(p[i]) * f);
    }
  } else if constexpr (std::is_same_v<T, float>) {
    float f = static_cast<float>(factor);
    for (std::size_t i = 0; i < n; ++i) p[i] *= f;
  } else if constexpr (std::is_same_v<T, double>) {
    for (std::size_t i = 0; i < n; ++i) p[i] *= factor;
  } else {  // integers: divide by the rank count
    auto d = static_cast<T>(std::llround(1.0 / factor));
    if (d == 0) d = 1;
    for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / d);
  }
}

class CpuFusionOps final : public FusionOps {
 public:
  void pack(void* dst, const void* src, std::size_t bytes, Device) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void unpack(void* dst, const void* src, std::size_t bytes, Device) override {
    if (bytes && dst != src) std::memcpy(dst, src, bytes);
  }
  void scale(void* buf, std::size_t count, DType dt, double factor, Device) override {
    dispatch_dtype(dt, [&](auto tag) { scale_loop(static_cast<decltype(tag)*>(buf), count, factor); });
  }
  void compress_f16(void* dst, const void* src, std::size_t n, DType src_dt, Device) override {
    auto* d = static_cast<float16*>(dst);
    if (src_dt == DType::f32) {
      auto* s = static_cast<const float*>(src);
      for (std::size_t i = 0; i < n; ++i) d[i] = to_f16(s[i]);
    } else {
      RT_CHECK(src_dt == DType::f64, "compress_f16: unsupported dtype ", dtype_name(src_dt));
      auto* s = static_cast<const double*>(src);
      for (std::size_t i = 0; i < n; ++i) d[i] = to_f16(static_cast<float>(s[i]));
    }
  }
  void decompress_f16(void* dst, const void* src, std::size_t n, DType dst_dt, double factor,
                      Device) override {
    auto* s = static_cast<const float16*>(src);
    float f = static_cast<float>(factor);
    if (dst_dt == DType::f32) {
      auto* d = static_cast<float*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = to_f32(s[i]) * f;
    } else {
      RT_CHECK(dst_dt == DType::f64, "decompress_f16: unsupported dtype ", dtype_name(dst_dt));
      auto* d = static_cast<double*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<double>(to_f32(s[i]) * f);
    }
  }
};

}  // namespace

std::shared_ptr<FusionOps> cpu_fusion_ops() { return std::make_shared<CpuFusionOps>(); }

}  // namespace ringtrain
