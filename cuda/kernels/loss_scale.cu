#include "ringtrain/cuda/loss_scale.hpp"

#include "kernels/launch.cuh"
#include "ringtrain/cuda/element_math.hpp"
#include "ringtrain/cuda/memory.hpp"

namespace ringtrain::cuda {
namespace {

template <typename T>
__global__ void unscale_kernel(T* g, std::size_t n, LossScaleState* st) {
  const float inv = st->inv_scale;
  bool bad = false;
  RT_GRID_STRIDE(i, n) {
    auto v = to_acc(g[i]) * static_cast<acc_t<T>>(inv);
    bad |= !isfinite(v);
    g[i] = from_acc<T>(v);
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) st->found_inf = 1;
}

__global__ void update_kernel(LossScaleState* st, LossScaleConfig cfg) { loss_scale_step(*st, cfg); }

}  // namespace

DynamicLossScaler::DynamicLossScaler(const LossScaleConfig& cfg, int device) : cfg_(cfg), device_(device) {
  RT_CHECK(cfg.init_scale > 0 && cfg.growth >= 1 && cfg.backoff > 0 && cfg.backoff < 1 && cfg.interval > 0,
           "loss scaling: need init_scale > 0, growth >= 1, 0 < backoff < 1, interval > 0 (got ", cfg.init_scale,
           ", ", cfg.growth, ", ", cfg.backoff, ", ", cfg.interval, ")");
  state_ = static_cast<LossScaleState*>(device_allocator().allocate(sizeof(LossScaleState), Device::cuda(device)));
  LossScaleState s;
  s.scale = cfg.init_scale;
  s.inv_scale = 1.0f / cfg.init_scale;
  RT_CUDA(cudaMemcpy(state_, &s, sizeof s, cudaMemcpyHostToDevice));
}

DynamicLossScaler::~DynamicLossScaler() {
  if (state_) device_allocator().deallocate(state_, sizeof(LossScaleState), Device::cuda(device_));
}

void DynamicLossScaler::unscale_and_check(void* grads, std::size_t n, DType dt, cudaStream_t s) {
  if (n == 0) return;
  detail::dispatch_float(dt, "loss scaling unscale_and_check", [&](auto tag) {
    using T = decltype(tag);
    unscale_kernel<T><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(static_cast<T*>(grads), n, state_);
  });
  RT_CUDA_LAUNCHED("unscale_and_check");
}

void DynamicLossScaler::update(cudaStream_t s) {
  update_kernel<<<1, 1, 0, s>>>(state_, cfg_);
  RT_CUDA_LAUNCHED("loss scale update");
}

LossScaleState DynamicLossScaler::read(cudaStream_t s) const {
  LossScaleState h;
  RT_CUDA(cudaMemcpyAsync(&h, state_, sizeof h, cudaMemcpyDeviceToHost, s));
  RT_CUDA(cudaStreamSynchronize(s));
  return h;
}

void DynamicLossScaler::write(const LossScaleState& h, cudaStream_t s) {
  RT_CUDA(cudaMemcpyAsync(state_, &h, sizeof h, cudaMemcpyHostToDevice, s));
  RT_CUDA(cudaStreamSynchronize(s));  // h is pageable and may go out of scope
}

}  // namespace ringtrain::cuda
