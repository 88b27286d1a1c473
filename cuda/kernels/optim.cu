// DeviceOptimizer: fused SGD / Adam / AdamW / LAMB kernels over the arena's
// flat buffers, calling optim_math's RT_HD per-element updates.
#include <math.h>

#include "kernels/launch.cuh"
#include "ringtrain/cuda/memory.hpp"
#include "ringtrain/cuda/optim.hpp"
#include "ringtrain/optim/update_math.hpp"

namespace ringtrain::cuda {
namespace om = ringtrain::optim_math;

namespace {

struct Segment {
  std::size_t offset, n;
  int decay;
};

struct Hyper {
  double momentum, dampening, wd, beta1, beta2, eps;
  bool nesterov, decoupled, bias_correction;
};

// Coefficients for one compute type, [0] without and [1] with weight decay.
template <typename C>
struct Coeffs {
  om::SgdCoeffs<C> sgd[2];
  om::AdamCoeffs<C> adam[2];
  om::LambCoeffs<C> lamb[2];
};
struct DeviceCoeffs {
  Coeffs<float> f;
  Coeffs<double> d;
};

// The host factories of update_math.hpp, evaluated on the device for step t
// (same formulas, double precision, then rounded to C).
template <typename C>
__device__ void make_coeffs(Coeffs<C>& k, double lr, const Hyper& h, long long t) {
  double bc1 = 1.0 - pow(h.beta1, static_cast<double>(t));
  double bc2 = 1.0 - pow(h.beta2, static_cast<double>(t));
  for (int dec = 0; dec < 2; ++dec) {
    double wd = dec ? h.wd : 0.0;
    k.sgd[dec] = {C(lr), C(wd), C(h.momentum), C(1.0 - h.dampening), h.nesterov, t == 1};
    k.adam[dec] = {C(h.beta1), C(1.0 - h.beta1), C(h.beta2), C(1.0 - h.beta2), C(-(lr / bc1)), C(sqrt(bc2)),
                   C(h.eps), h.decoupled ? C(0) : C(wd), h.decoupled ? C(1.0 - lr * wd) : C(1)};
    double lb1 = h.bias_correction ? bc1 : 1.0, lb2 = h.bias_correction ? bc2 : 1.0;
    k.lamb[dec] = {C(h.beta1), C(1.0 - h.beta1), C(h.beta2), C(1.0 - h.beta2), C(1.0 / lb1), C(1.0 / lb2),
                   C(h.eps), C(wd)};
  }
}

__global__ void prepare_kernel(DeviceCoeffs* k, double lr, Hyper h, long long t) {
  make_coeffs(k->f, lr, h, t);
  make_coeffs(k->d, lr, h, t);
}

template <typename C> __device__ const Coeffs<C>& pick(const DeviceCoeffs* k);
template <> __device__ const Coeffs<float>& pick<float>(const DeviceCoeffs* k) { return k->f; }
template <> __device__ const Coeffs<double>& pick<double>(const DeviceCoeffs* k) { return k->d; }

#define RT_SEGMENT_LOOP(j, seg)                                                                   \
  for (std::size_t j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; j < (seg).n; \
       j += static_cast<std::size_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void sgd_kernel(T* p, const T* g, om::compute_t<T>* buf, const Segment* segs, const DeviceCoeffs* kc) {
  using C = om::compute_t<T>;
  const Segment s = segs[blockIdx.y];
  const om::SgdCoeffs<C> k = pick<C>(kc).sgd[s.decay];
  RT_SEGMENT_LOOP(j, s) {
    std::size_t i = s.offset + j;
    C pj = om::load(p[i]);
    C unused = C(0);
    om::sgd_update(pj, om::load(g[i]), buf ? buf[i] : unused, k);
    om::store(p[i], pj);
  }
}

template <typename T>
__global__ void adam_kernel(T* p, const T* g, om::compute_t<T>* m, om::compute_t<T>* v, const Segment* segs,
                            const DeviceCoeffs* kc) {
  using C = om::compute_t<T>;
  const Segment s = segs[blockIdx.y];
  const om::AdamCoeffs<C> k = pick<C>(kc).adam[s.decay];
  RT_SEGMENT_LOOP(j, s) {
    std::size_t i = s.offset + j;
    C pj = om::load(p[i]);
    om::adam_update(pj, om::load(g[i]), m[i], v[i], k);
    om::store(p[i], pj);
  }
}

// LAMB phase 1 (decaying tensors only): moments, and per-block partial sums of
// |w|^2 and |u|^2 into partial[seg * gridDim.x + block].
template <typename T>
__global__ void lamb_moments_kernel(const T* p, const T* g, om::compute_t<T>* m, om::compute_t<T>* v,
                                    const Segment* segs, const DeviceCoeffs* kc, double2* partial) {
  using C = om::compute_t<T>;
  const Segment s = segs[blockIdx.y];
  double sw = 0.0, su = 0.0;
  if (s.decay) {
    const om::LambCoeffs<C> k = pick<C>(kc).lamb[1];
    RT_SEGMENT_LOOP(j, s) {
      std::size_t i = s.offset + j;
      C pj = om::load(p[i]);
      om::lamb_moments(om::load(g[i]), m[i], v[i], k);
      double u = static_cast<double>(om::lamb_direction(pj, m[i], v[i], k));
      sw += static_cast<double>(pj) * static_cast<double>(pj);
      su += u * u;
    }
  }
  // Fixed-order block reduction (warp shuffles, then warp 0).
  __shared__ double shw[32], shu[32];
  for (int o = 16; o > 0; o >>= 1) {
    sw += __shfl_down_sync(0xffffffffu, sw, o);
    su += __shfl_down_sync(0xffffffffu, su, o);
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    shw[warp] = sw;
    shu[warp] = su;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double a = 0.0, b = 0.0;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
      a += shw[w];
      b += shu[w];
    }
    partial[static_cast<std::size_t>(blockIdx.y) * gridDim.x + blockIdx.x] = make_double2(a, b);
  }
}

// One thread per tensor: trust ratio r (1 for non-decaying tensors) -> lr * r.
__global__ void lamb_ratio_kernel(const double2* partial, int blocks, const Segment* segs, int nseg, double lr,
                                  double max_ratio, double* scaled_lr) {
  int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= nseg) return;
  double ratio = 1.0;
  if (segs[s].decay) {
    double w = 0.0, u = 0.0;
    for (int b = 0; b < blocks; ++b) {
      w += partial[static_cast<std::size_t>(s) * blocks + b].x;
      u += partial[static_cast<std::size_t>(s) * blocks + b].y;
    }
    double wn = sqrt(w), un = sqrt(u);
    ratio = (wn > 0.0 && un > 0.0) ? wn / un : 1.0;  // optim_math::lamb_trust_ratio
    if (max_ratio > 0.0 && ratio > max_ratio) ratio = max_ratio;
  }
  scaled_lr[s] = lr * ratio;
}

template <typename T>
__global__ void lamb_apply_kernel(T* p, const T* g, om::compute_t<T>* m, om::compute_t<T>* v, const Segment* segs,
                                  const DeviceCoeffs* kc, const double* scaled_lr) {
  using C = om::compute_t<T>;
  const Segment s = segs[blockIdx.y];
  const om::LambCoeffs<C> k = pick<C>(kc).lamb[s.decay];
  const C lr = C(scaled_lr[blockIdx.y]);
  RT_SEGMENT_LOOP(j, s) {
    std::size_t i = s.offset + j;
    C pj = om::load(p[i]);
    if (!s.decay) om::lamb_moments(om::load(g[i]), m[i], v[i], k);
    om::lamb_apply(pj, om::lamb_direction(pj, m[i], v[i], k), lr);
    om::store(p[i], pj);
  }
}

}  // namespace

struct DeviceOptimizer::Group {
  DType dtype;
  Device dev;
  std::vector<Segment> host_segs;
  Segment* segs = nullptr;
  unsigned gx = 1;  // blocks per segment
  Tensor s1, s2;    // views of the Optimizer's state (momentum | exp_avg, exp_avg_sq)
  double2* partial = nullptr;
  double* scaled_lr = nullptr;
  ~Group() {
    auto& a = device_allocator();
    if (segs) a.deallocate(segs, host_segs.size() * sizeof(Segment), dev);
    if (partial) a.deallocate(partial, host_segs.size() * gx * sizeof(double2), dev);
    if (scaled_lr) a.deallocate(scaled_lr, host_segs.size() * sizeof(double), dev);
  }
};

namespace {
// Validates before the base class allocates state on the device.
const char* device_kind(const ParamArena& arena, const OptimizerConfig& cfg, const CudaContext& ctx) {
  RT_CHECK(arena.finalized() && arena.device() == ctx.device(), "CUDA optimizer: the arena must be finalised on ",
           ctx.device().str(), " (it is on ", arena.device().str(), ")");
  std::string k = canonical_optimizer_name(cfg.name);
  for (const char* known : {"sgd", "adam", "adamw", "lamb"})
    if (k == known) return known;
  RT_FAIL("optimizer '", k, "' has no CUDA implementation (sgd, adam, adamw, lamb); use one of those, or train on the CPU");
}
}  // namespace

DeviceOptimizer::DeviceOptimizer(ParamArena& arena, const OptimizerConfig& cfg, CudaContext& ctx)
    : Optimizer(arena, cfg, device_kind(arena, cfg, ctx)), kind_(name()), ctx_(ctx) {
  ctx_.make_current();
  if (kind_ == "sgd") {
    if (cfg.momentum != 0.0) add_state("momentum_buffer");
  } else {
    add_state("exp_avg");
    add_state("exp_avg_sq");
  }
  Device dev = ctx.device();
  auto& alloc = device_allocator();
  coeffs_ = alloc.allocate(sizeof(DeviceCoeffs), dev);
  for (DType dt : arena.dtypes()) {
    auto g = std::make_unique<Group>();
    g->dtype = dt;
    g->dev = dev;
    std::size_t max_n = 1;
    for (std::size_t i = 0; i < arena.size(); ++i) {
      const ParamInfo& info = arena.info(i);
      if (info.dtype != dt) continue;
      std::size_t n = static_cast<std::size_t>(shape_numel(info.shape));
      g->host_segs.push_back({info.offset, n, decays(i) ? 1 : 0});
      max_n = std::max(max_n, n);
    }
    RT_CHECK(g->host_segs.size() < 65536, "CUDA optimizer: more than 65535 parameters of one dtype");
    g->gx = static_cast<unsigned>(std::clamp<std::size_t>((max_n + 4 * detail::kThreads - 1) / (4 * detail::kThreads),
                                                          1, 256));
    std::size_t ns = g->host_segs.size();
    g->segs = static_cast<Segment*>(alloc.allocate(ns * sizeof(Segment), dev));
    RT_CUDA(cudaMemcpy(g->segs, g->host_segs.data(), ns * sizeof(Segment), cudaMemcpyHostToDevice));
    if (kind_ == "sgd") {
      if (cfg.momentum != 0.0) g->s1 = state_flat("momentum_buffer", dt);
    } else {
      g->s1 = state_flat("exp_avg", dt);
      g->s2 = state_flat("exp_avg_sq", dt);
    }
    if (kind_ == "lamb") {
      g->partial = static_cast<double2*>(alloc.allocate(ns * g->gx * sizeof(double2), dev));
      g->scaled_lr = static_cast<double*>(alloc.allocate(ns * sizeof(double), dev));
    }
    groups_.push_back(std::move(g));
  }
  ctx.sync_compute();
}

DeviceOptimizer::~DeviceOptimizer() {
  cudaStreamSynchronize(ctx_.compute());
  groups_.clear();
  if (coeffs_) device_allocator().deallocate(coeffs_, sizeof(DeviceCoeffs), ctx_.device());
}

void DeviceOptimizer::update(double lr, std::int64_t t) {
  const OptimizerConfig& c = config();
  cudaStream_t st = ctx_.compute();
  auto* kc = static_cast<DeviceCoeffs*>(coeffs_);
  Hyper h{c.momentum, c.dampening, c.weight_decay, c.beta1, c.beta2, c.eps, c.nesterov, kind_ == "adamw",
          c.bias_correction};
  prepare_kernel<<<1, 1, 0, st>>>(kc, lr, h, static_cast<long long>(t));
  RT_CUDA_LAUNCHED("optimizer prepare");
  for (auto& gp : groups_) {
    Group& g = *gp;
    dim3 grid(g.gx, static_cast<unsigned>(g.host_segs.size()));
    int ns = static_cast<int>(g.host_segs.size());
    detail::dispatch_float(g.dtype, "CUDA optimizer", [&](auto tag) {
      using T = decltype(tag);
      using C = om::compute_t<T>;
      T* p = static_cast<T*>(arena().params_flat(g.dtype).raw());
      const T* gr = static_cast<const T*>(arena().grads_flat(g.dtype).raw());
      C* s1 = g.s1.defined() ? static_cast<C*>(g.s1.raw()) : nullptr;
      C* s2 = g.s2.defined() ? static_cast<C*>(g.s2.raw()) : nullptr;
      if (kind_ == "sgd") {
        sgd_kernel<T><<<grid, detail::kThreads, 0, st>>>(p, gr, s1, g.segs, kc);
      } else if (kind_ == "lamb") {
        lamb_moments_kernel<T><<<grid, detail::kThreads, 0, st>>>(p, gr, s1, s2, g.segs, kc, g.partial);
        lamb_ratio_kernel<<<(ns + 127) / 128, 128, 0, st>>>(g.partial, static_cast<int>(g.gx), g.segs, ns, lr,
                                                            c.max_trust_ratio, g.scaled_lr);
        lamb_apply_kernel<T><<<grid, detail::kThreads, 0, st>>>(p, gr, s1, s2, g.segs, kc, g.scaled_lr);
      } else {
        adam_kernel<T><<<grid, detail::kThreads, 0, st>>>(p, gr, s1, s2, g.segs, kc);
      }
    });
    RT_CUDA_LAUNCHED("optimizer update");
  }
}

}  // namespace ringtrain::cuda
