// Softmax cross-entropy with label smoothing, forward and backward fused: one
// block per row (three passes over the row's logits, which stay in L1/L2), the
// mean computed by a second single-block kernel in a fixed order so the loss
// is bitwise reproducible run to run (no float atomics).
#include <cfloat>
#include <type_traits>

#include "kernels/launch.cuh"
#include "ringtrain/cuda/element_math.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda {
namespace {

constexpr int kRowThreads = 256;

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// (value, index): larger value wins, ties go to the smaller index (first max, as std::max_element).
__device__ void warp_argmax(float& v, int& idx) {
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
}

// Block-wide sum/max; all threads get the result. `sh` holds 32 floats.
__device__ float block_sum(float v, float* sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // sh may still be read from a previous call
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : 0.0f;
  return warp_sum(v);
}
__device__ void block_argmax(float& v, int& idx, float* shv, int* shi) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  warp_argmax(v, idx);
  __syncthreads();
  if (lane == 0) {
    shv[warp] = v;
    shi[warp] = idx;
  }
  __syncthreads();
  v = lane < nw ? shv[lane] : -FLT_MAX;
  idx = lane < nw ? shi[lane] : 0x7fffffff;
  warp_argmax(v, idx);
}

template <typename T, typename L>
__global__ void xent_rows_kernel(const T* logits, const L* labels, int classes, float smoothing, T* dlogits,
                                 const float* grad_scale, float inv_rows, float* row_loss, int* row_correct,
                                 int* bad_label) {
  __shared__ float shv[32];
  __shared__ int shi[32];
  int row = blockIdx.x;
  const T* z = logits + static_cast<std::size_t>(row) * classes;
  long long y = static_cast<long long>(labels[row]);
  bool valid = y >= 0 && y < classes;

  float mx = -FLT_MAX;
  int amax = 0x7fffffff;
  float zsum = 0.0f;
  for (int c = threadIdx.x; c < classes; c += blockDim.x) {
    float v = static_cast<float>(to_acc(z[c]));
    if (v > mx) {  // strided ascending c: the first max of this thread's slice
      mx = v;
      amax = c;
    }
    zsum += v;
  }
  float m = mx;
  int am = amax;
  block_argmax(m, am, shv, shi);  // m is the row max
  zsum = block_sum(zsum, shv);
  float se = 0.0f;
  for (int c = threadIdx.x; c < classes; c += blockDim.x) se += expf(static_cast<float>(to_acc(z[c])) - m);
  se = block_sum(se, shv);
  float lse = m + logf(se);

  float on = 1.0f - smoothing, off = smoothing / static_cast<float>(classes);
  if (threadIdx.x == 0) {
    if (valid) {
      float zy = static_cast<float>(to_acc(z[y]));
      row_loss[row] = lse - on * zy - off * zsum;
      row_correct[row] = (am == y) ? 1 : 0;
    } else {
      row_loss[row] = 0.0f;
      row_correct[row] = 0;
      if (bad_label) *bad_label = 1;
    }
  }
  if (dlogits) {
    float g = (grad_scale ? *grad_scale : 1.0f) * inv_rows;
    T* dz = dlogits + static_cast<std::size_t>(row) * classes;
    for (int c = threadIdx.x; c < classes; c += blockDim.x) {
      float p = expf(static_cast<float>(to_acc(z[c])) - lse);
      float q = off + (c == y ? on : 0.0f);
      dz[c] = from_acc<T>(static_cast<acc_t<T>>(valid ? (p - q) * g : 0.0f));
    }
  }
}

// Mean of the row losses and count of correct rows, in a fixed order.
__global__ void xent_finish_kernel(const float* row_loss, const int* row_correct, int rows, float* loss,
                                   int* correct) {
  __shared__ float sh[32];
  float s = 0.0f, c = 0.0f;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    s += row_loss[r];
    c += static_cast<float>(row_correct[r]);
  }
  s = block_sum(s, sh);
  c = block_sum(c, sh);  // exact: counts < 2^24
  if (threadIdx.x == 0) {
    *loss = s / static_cast<float>(rows);
    if (correct) *correct = static_cast<int>(c);
  }
}

}  // namespace

std::size_t xent_scratch_bytes(int rows) { return static_cast<std::size_t>(rows) * (sizeof(float) + sizeof(int)); }

void softmax_xent(const XentArgs& a, void* scratch, cudaStream_t s) {
  RT_CHECK(a.rows > 0 && a.classes > 0, "softmax_xent: rows (", a.rows, ") and classes (", a.classes,
           ") must be positive");
  RT_CHECK(a.logits && a.labels && a.loss && scratch, "softmax_xent: logits, labels, loss and scratch are required");
  RT_CHECK(a.smoothing >= 0.0f && a.smoothing < 1.0f, "softmax_xent: label smoothing ", a.smoothing,
           " must be in [0, 1)");
  RT_CHECK(a.labels_dtype == DType::i32 || a.labels_dtype == DType::i64, "softmax_xent: labels must be int32 or int64, got ",
           dtype_name(a.labels_dtype));
  RT_CHECK(a.logits_dtype != DType::f64, "softmax_xent: float64 logits are not supported on the GPU");
  auto* row_loss = static_cast<float*>(scratch);
  auto* row_correct = reinterpret_cast<int*>(row_loss + a.rows);
  float inv_rows = 1.0f / static_cast<float>(a.rows);
  detail::dispatch_float(a.logits_dtype, "softmax_xent", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, double>) {
      auto launch = [&](auto ltag) {
        using L = decltype(ltag);
        xent_rows_kernel<T, L><<<a.rows, kRowThreads, 0, s>>>(
            static_cast<const T*>(a.logits), static_cast<const L*>(a.labels), a.classes, a.smoothing,
            static_cast<T*>(a.dlogits), a.grad_scale, inv_rows, row_loss, row_correct, a.bad_label);
      };
      if (a.labels_dtype == DType::i32) launch(std::int32_t{});
      else launch(std::int64_t{});
    }
  });
  RT_CUDA_LAUNCHED("softmax_xent rows");
  xent_finish_kernel<<<1, 1024, 0, s>>>(row_loss, row_correct, a.rows, a.loss, a.correct);
  RT_CUDA_LAUNCHED("softmax_xent finish");
}

}  // namespace ringtrain::cuda
