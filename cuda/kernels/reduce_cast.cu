// Reductions for the device collectives, divide (avg), casts, fills, scale.
#include <type_traits>

#include "kernels/launch.cuh"
#include "ringtrain/cuda/element_math.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda {
namespace {

template <typename T, ReduceOp Op>
__global__ void reduce_kernel(T* dst, const T* a, const T* b, std::size_t n, int divisor) {
  if (divisor > 1) {
    RT_GRID_STRIDE(i, n) { dst[i] = reduce_one_div<Op>(a[i], b[i], divisor); }
  } else {
    RT_GRID_STRIDE(i, n) { dst[i] = reduce_one<Op>(a[i], b[i]); }
  }
}

template <typename T>
__global__ void divide_kernel(T* x, std::size_t n, int d) {
  RT_GRID_STRIDE(i, n) {
    x[i] = from_acc<T>(divide_by(to_acc(x[i]), d));
  }
}

template <typename D, typename S>
__global__ void cast_kernel(D* dst, const S* src, std::size_t n) {
  RT_GRID_STRIDE(i, n) {
    // Through float, except f64<->f64 paths which keep double precision.
    if constexpr (std::is_same_v<D, double>) dst[i] = static_cast<double>(to_acc(src[i]));
    else if constexpr (std::is_same_v<S, double>) dst[i] = from_acc<D>(static_cast<float>(src[i]));
    else dst[i] = from_acc<D>(static_cast<float>(to_acc(src[i])));
  }
}

template <typename T>
__global__ void fill_kernel(T* x, std::size_t n, T v) {
  RT_GRID_STRIDE(i, n) { x[i] = v; }
}

template <typename T>
__global__ void scale_kernel(T* x, std::size_t n, double f) {
  RT_GRID_STRIDE(i, n) {
    using A = acc_t<T>;
    x[i] = from_acc<T>(to_acc(x[i]) * static_cast<A>(f));
  }
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, std::size_t n, DType dt, ReduceOp op, int divisor,
            cudaStream_t s) {
  if (n == 0) return;
  RT_CHECK(dst && a && b, "cuda::reduce: null buffer");
  detail::dispatch_collective(dt, "cuda::reduce", [&](auto tag) {
    using T = decltype(tag);
    auto* d = static_cast<T*>(dst);
    auto* x = static_cast<const T*>(a);
    auto* y = static_cast<const T*>(b);
    unsigned g = detail::blocks_for(n);
    switch (op) {
      case ReduceOp::min: reduce_kernel<T, ReduceOp::min><<<g, detail::kThreads, 0, s>>>(d, x, y, n, divisor); break;
      case ReduceOp::max: reduce_kernel<T, ReduceOp::max><<<g, detail::kThreads, 0, s>>>(d, x, y, n, divisor); break;
      default: reduce_kernel<T, ReduceOp::sum><<<g, detail::kThreads, 0, s>>>(d, x, y, n, divisor); break;
    }
  });
  RT_CUDA_LAUNCHED("reduce");
}

void divide(void* x, std::size_t n, DType dt, int divisor, cudaStream_t s) {
  RT_CHECK(divisor > 0, "cuda::divide: divisor ", divisor, " must be positive");
  if (n == 0 || divisor == 1) return;
  detail::dispatch_collective(dt, "cuda::divide", [&](auto tag) {
    using T = decltype(tag);
    divide_kernel<T><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(static_cast<T*>(x), n, divisor);
  });
  RT_CUDA_LAUNCHED("divide");
}

void cast(void* dst, DType ddt, const void* src, DType sdt, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  bool src_ok = is_floating(sdt) || sdt == DType::i32 || sdt == DType::i64;
  RT_CHECK(src_ok, "cuda::cast: source dtype ", dtype_name(sdt), " is not supported");
  RT_CHECK(is_floating(ddt), "cuda::cast: destination dtype ", dtype_name(ddt), " is not floating");
  detail::dispatch_float(ddt, "cuda::cast", [&](auto dtag) {
    using D = decltype(dtag);
    auto launch = [&](auto stag) {
      using S = decltype(stag);
      cast_kernel<D, S><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(static_cast<D*>(dst),
                                                                           static_cast<const S*>(src), n);
    };
    if (sdt == DType::i32) launch(std::int32_t{});
    else if (sdt == DType::i64) launch(std::int64_t{});
    else detail::dispatch_float(sdt, "cuda::cast", launch);
  });
  RT_CUDA_LAUNCHED("cast");
}

void fill(void* x, std::size_t n, DType dt, double value, cudaStream_t s) {
  if (n == 0) return;
  detail::dispatch_collective(dt, "cuda::fill", [&](auto tag) {
    using T = decltype(tag);
    T v;
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) v = from_acc<T>(static_cast<float>(value));
    else v = static_cast<T>(value);
    fill_kernel<T><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(static_cast<T*>(x), n, v);
  });
  RT_CUDA_LAUNCHED("fill");
}

void scale(void* x, std::size_t n, DType dt, double factor, cudaStream_t s) {
  if (n == 0) return;
  detail::dispatch_float(dt, "cuda::scale", [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(static_cast<T*>(x), n, factor);
  });
  RT_CUDA_LAUNCHED("scale");
}

}  // namespace ringtrain::cuda
