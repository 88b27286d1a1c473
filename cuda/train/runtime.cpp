// The CUDA DeviceRuntime (parallel/device_runtime.hpp): device choice by
// node-local rank, DeviceOptimizer, the fusion engine's kernels, and the
// step's whole-arena gradient operations on the backend's compute stream.
#include <cmath>
#include <map>
#include <mutex>

#include "ringtrain/cuda/backend.hpp"
#include "ringtrain/cuda/check.hpp"
#include "ringtrain/cuda/fusion.hpp"
#include "ringtrain/cuda/kernels.hpp"
#include "ringtrain/cuda/optim.hpp"
#include "ringtrain/cuda/registry.hpp"

namespace ringtrain::cuda {
namespace {

class CudaRuntime final : public DeviceRuntime {
 public:
  DeviceKind kind() const override { return DeviceKind::cuda; }

  Device select(const Communicator& world) override {
    int dev = select_device(world);
    backend_context(dev);  // streams and handles on the chosen device, before any layer exists
    return Device::cuda(dev);
  }

  std::unique_ptr<Optimizer> make_optimizer(ParamArena& arena, const OptimizerConfig& cfg) override {
    RT_CHECK(arena.device().is_cuda(), "CUDA runtime: the arena is on ", arena.device().str());
    return std::make_unique<DeviceOptimizer>(arena, cfg, backend_context(arena.device().index));
  }

  std::shared_ptr<FusionOps> fusion_ops(Device dev) override {
    // One per engine: an expert-parallel stage runs two engines (dense and expert gradients) on their own
    // threads, and the ops' copy table and its pinned mirror are per-call state (shared, they raced).
    return make_fusion_ops(backend_context(dev.index));
  }

  void scale(Tensor& t, double s) override {
    CudaContext& ctx = context_of(t.device(), "scale");
    cuda::scale(t.raw(), static_cast<std::size_t>(t.numel()), t.dtype(), s, ctx.compute());
  }

  bool unscale_grads(ParamArena& arena, double inv_scale) override {
    RT_CHECK(std::isfinite(inv_scale) && inv_scale > 0, "unscale_grads: inv_scale must be finite and > 0, got ",
             inv_scale);
    CudaContext& ctx = context_of(arena.device(), "unscale_grads");
    Scratch& sc = scratch(ctx);
    RT_CUDA(cudaMemsetAsync(sc.flag.raw(), 0, sizeof(int), ctx.compute()));
    for (DType dt : arena.dtypes()) {
      Tensor g = arena.grads_flat(dt);
      unscale_and_check(g.raw(), static_cast<std::size_t>(g.numel()), dt, static_cast<float>(inv_scale),
                        sc.flag.device_data<int>(), ctx.compute());
    }
    int bad = 0;
    RT_CUDA(cudaMemcpyAsync(&bad, sc.flag.raw(), sizeof bad, cudaMemcpyDeviceToHost, ctx.compute()));
    ctx.sync_compute();
    return bad == 0;
  }

  double grad_sq_norm(const ParamArena& arena, const std::vector<char>& include) override {
    RT_CHECK(include.empty() || include.size() == arena.size(), "grad_sq_norm: selection of ", include.size(),
             " entries for ", arena.size(), " parameters");
    CudaContext& ctx = context_of(arena.device(), "grad_sq_norm");
    Scratch& sc = scratch(ctx);
    bool first = true;
    // One kernel per run of consecutive selected parameters of a dtype (padding
    // between them is zero): the whole flat buffer when everything is selected.
    auto span = [&](DType dt, std::size_t lo, std::size_t hi) {
      Tensor g = arena.grads_flat(dt);
      sum_squares(static_cast<char*>(g.raw()) + lo * dtype_size(dt), hi - lo, dt, sc.norm.device_data<double>(), !first,
                  sc.partial.raw(), ctx.compute());
      first = false;
    };
    if (include.empty()) {
      for (DType dt : arena.dtypes()) span(dt, 0, static_cast<std::size_t>(arena.grads_flat(dt).numel()));
    } else {
      std::size_t i = 0;
      while (i < arena.size()) {
        if (!include[i]) { ++i; continue; }
        const ParamInfo& p0 = arena.info(i);
        std::size_t j = i + 1;
        while (j < arena.size() && include[j] && arena.info(j).dtype == p0.dtype && arena.info(j).offset > p0.offset) ++j;
        const ParamInfo& pl = arena.info(j - 1);
        span(p0.dtype, p0.offset, pl.offset + static_cast<std::size_t>(shape_numel(pl.shape)));
        i = j;
      }
    }
    double sq = 0.0;
    if (!first) RT_CUDA(cudaMemcpyAsync(&sq, sc.norm.raw(), sizeof sq, cudaMemcpyDeviceToHost, ctx.compute()));
    ctx.sync_compute();
    return sq;
  }

  void synchronize(Device dev) override { context_of(dev, "synchronize").sync_compute(); }

 private:
  struct Scratch {
    Tensor flag, norm, partial;
  };

  static CudaContext& context_of(Device dev, const char* what) {
    RT_CHECK(dev.is_cuda(), "CUDA runtime ", what, ": tensor is on ", dev.str());
    return backend_context(dev.index);
  }

  Scratch& scratch(CudaContext& ctx) {
    std::lock_guard lk(mu_);
    Scratch& sc = scratch_[ctx.device_index()];
    if (!sc.flag.defined()) {
      Device d = ctx.device();
      sc.flag = Tensor::empty({1}, DType::i32, d);
      sc.norm = Tensor::empty({1}, DType::f64, d);
      sc.partial = Tensor::empty({static_cast<std::int64_t>(sum_squares_scratch_bytes())}, DType::u8, d);
    }
    return sc;
  }

  std::mutex mu_;
  std::map<int, Scratch> scratch_;
};

}  // namespace

std::unique_ptr<DeviceRuntime> make_cuda_runtime() { return std::make_unique<CudaRuntime>(); }

}  // namespace ringtrain::cuda
