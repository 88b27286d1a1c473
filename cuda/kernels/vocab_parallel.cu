// The vocabulary-parallel cross-entropy and accuracy's local steps
// (Backend::vocab_row_max, vocab_xent_sums, vocab_xent_finish,
// vocab_count_hits; the CPU's are src/backend/cpu/vocab_parallel.cpp): one
// block per row for the maxima, the sums of exponentials and the gradient,
// one block for the loss's mean and the hits. Sums are in double, as the
// CPU's, in a fixed tree order (no float atomics): every run gives the same
// bits. The kernels use only block barriers and shared arrays, so
// tests/gpu/emulate/run.sh runs them on the CPU as well.
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/launch.cuh"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda {
namespace {

constexpr int kVocabThreads = 128;  // a power of two: the tree reductions halve it
constexpr std::int64_t kNone = LLONG_MAX;  // no column seen yet (sorts after every index)

// The block's sum in a fixed tree order; every thread gets it.
template <typename T>
__device__ T vocab_block_sum(T v, T* sh) {
  const int t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (int s = kVocabThreads / 2; s > 0; s >>= 1) {
    if (t < s) sh[t] += sh[t + s];
    __syncthreads();
  }
  const T r = sh[0];
  __syncthreads();  // sh may be reused at once
  return r;
}

// The block's largest value and its first index (ties: the smaller index, as std::max_element).
__device__ void vocab_block_argmax(float& v, std::int64_t& at, float* shv, std::int64_t* shi) {
  const int t = threadIdx.x;
  shv[t] = v;
  shi[t] = at;
  __syncthreads();
  for (int s = kVocabThreads / 2; s > 0; s >>= 1) {
    if (t < s) {
      const float ov = shv[t + s];
      const std::int64_t oi = shi[t + s];
      if (ov > shv[t] || (ov == shv[t] && oi < shi[t])) {
        shv[t] = ov;
        shi[t] = oi;
      }
    }
    __syncthreads();
  }
  v = shv[0];
  at = shi[0];
  __syncthreads();
}

// The largest of row r's summed maxima (std::max's order, as the CPU).
__device__ float vocab_whole_max(const float* maxes, std::int64_t r, int parts) {
  float m = -INFINITY;
  for (int k = 0; k < parts; ++k) {
    const float v = maxes[r * parts + k];
    m = m < v ? v : m;
  }
  return m;
}

__global__ void vocab_row_max_kernel(VocabSlice a, float* maxes, std::int64_t* best, unsigned long long* bad) {
  __shared__ float shv[kVocabThreads];
  __shared__ std::int64_t shi[kVocabThreads];
  const std::int64_t r = blockIdx.x;
  const float* xr = a.logits + r * a.local;
  float v = -INFINITY;
  std::int64_t at = kNone;
  for (std::int64_t c = threadIdx.x; c < a.local; c += kVocabThreads) {
    const float x = xr[c];
    if (at == kNone || x > v) {  // ascending c: the first maximum of this thread's columns
      v = x;
      at = c;
    }
  }
  vocab_block_argmax(v, at, shv, shi);
  for (int k = threadIdx.x; k < a.parts; k += kVocabThreads) maxes[r * a.parts + k] = k == a.part ? v : 0.0f;
  if (threadIdx.x == 0) {
    if (best) best[r] = at;
    if (a.labels) {
      const std::int64_t y = a.labels[r];
      if (y < 0 || y >= std::int64_t(a.parts) * a.local) atomicMin(bad, static_cast<unsigned long long>(r));
    }
  }
}

__global__ void vocab_xent_sums_kernel(VocabSlice a, const float* maxes, double* sums) {
  __shared__ double sh[kVocabThreads];
  const std::int64_t r = blockIdx.x;
  const float* xr = a.logits + r * a.local;
  const double m = vocab_whole_max(maxes, r, a.parts);
  double s = 0;
  for (std::int64_t c = threadIdx.x; c < a.local; c += kVocabThreads) s += exp(double(xr[c]) - m);
  s = vocab_block_sum(s, sh);
  if (threadIdx.x == 0) {
    const std::int64_t y = a.labels[r];
    sums[r] = s;
    sums[a.rows + r] = y >= a.first && y < a.first + a.local ? double(xr[y - a.first]) : 0.0;
  }
}

__global__ void vocab_xent_grad_kernel(VocabSlice a, const float* maxes, const double* sums, float* dlogits,
                                       double* row_loss) {
  const std::int64_t r = blockIdx.x;
  const double m = vocab_whole_max(maxes, r, a.parts), z = sums[r];
  if (threadIdx.x == 0) row_loss[r] = log(z) + m - sums[a.rows + r];
  if (!dlogits) return;
  const float* xr = a.logits + r * a.local;
  float* dr = dlogits + r * a.local;
  const std::int64_t y = a.labels[r];
  for (std::int64_t c = threadIdx.x; c < a.local; c += kVocabThreads) {
    const double p = exp(double(xr[c]) - m) / z;
    dr[c] = float((p - (a.first + c == y ? 1.0 : 0.0)) / double(a.rows));
  }
}

__global__ void vocab_mean_kernel(const double* row_loss, std::int64_t rows, double* loss) {
  __shared__ double sh[kVocabThreads];
  double s = 0;
  for (std::int64_t r = threadIdx.x; r < rows; r += kVocabThreads) s += row_loss[r];
  s = vocab_block_sum(s, sh);
  if (threadIdx.x == 0) *loss = s / double(rows);
}

__global__ void vocab_hits_kernel(VocabSlice a, const float* maxes, const std::int64_t* best, double* hits) {
  __shared__ double sh[kVocabThreads];
  double n = 0;
  for (std::int64_t r = threadIdx.x; r < a.rows; r += kVocabThreads) {
    const float* mr = maxes + r * a.parts;
    int owner = 0;  // the first part holding the row's maximum
    for (int k = 1; k < a.parts; ++k)
      if (mr[k] > mr[owner]) owner = k;
    if (owner == a.part && a.first + best[r] == a.labels[r]) n += 1;
  }
  n = vocab_block_sum(n, sh);
  if (threadIdx.x == 0) *hits = n;
}

}  // namespace

// ---- launchers (not emulated) ----
namespace {

unsigned row_blocks(const VocabSlice& a, const char* what) {
  RT_CHECK(a.logits && a.rows > 0 && a.rows <= INT_MAX && a.local > 0 && a.parts >= 1 && a.part >= 0 &&
               a.part < a.parts && a.first == std::int64_t(a.part) * a.local,
           what, ": ", a.rows, " rows of ", a.local, " columns, part ", a.part, " of ", a.parts, " do not fit");
  return static_cast<unsigned>(a.rows);
}

}  // namespace

void vocab_row_max(const VocabSlice& a, float* maxes, std::int64_t* best, unsigned long long* bad,
                   cudaStream_t s) {
  const unsigned rows = row_blocks(a, "vocab_row_max");
  RT_CHECK(maxes && (!a.labels || bad), "vocab_row_max: maxes (and bad, with labels) are required");
  vocab_row_max_kernel<<<rows, kVocabThreads, 0, s>>>(a, maxes, best, bad);
  RT_CUDA_LAUNCHED("vocab_row_max");
}

void vocab_xent_sums(const VocabSlice& a, const float* maxes, double* sums, cudaStream_t s) {
  const unsigned rows = row_blocks(a, "vocab_xent_sums");
  RT_CHECK(a.labels && maxes && sums, "vocab_xent_sums: labels, maxes and sums are required");
  vocab_xent_sums_kernel<<<rows, kVocabThreads, 0, s>>>(a, maxes, sums);
  RT_CUDA_LAUNCHED("vocab_xent_sums");
}

void vocab_xent_finish(const VocabSlice& a, const float* maxes, const double* sums, float* dlogits,
                       double* row_loss, double* loss, cudaStream_t s) {
  const unsigned rows = row_blocks(a, "vocab_xent_finish");
  RT_CHECK(a.labels && maxes && sums && row_loss && loss, "vocab_xent_finish: labels, maxes, sums, row_loss and "
                                                          "loss are required");
  vocab_xent_grad_kernel<<<rows, kVocabThreads, 0, s>>>(a, maxes, sums, dlogits, row_loss);
  RT_CUDA_LAUNCHED("vocab_xent_finish rows");
  vocab_mean_kernel<<<1, kVocabThreads, 0, s>>>(row_loss, a.rows, loss);
  RT_CUDA_LAUNCHED("vocab_xent_finish mean");
}

void vocab_count_hits(const VocabSlice& a, const float* maxes, const std::int64_t* best, double* hits,
                      cudaStream_t s) {
  RT_CHECK(a.rows > 0 && a.parts >= 1 && a.part >= 0 && a.part < a.parts, "vocab_count_hits: ", a.rows,
           " rows, part ", a.part, " of ", a.parts, " do not fit");
  RT_CHECK(a.labels && maxes && best && hits, "vocab_count_hits: labels, maxes, best and hits are required");
  vocab_hits_kernel<<<1, kVocabThreads, 0, s>>>(a, maxes, best, hits);
  RT_CUDA_LAUNCHED("vocab_count_hits");
}

}  // namespace ringtrain::cuda
