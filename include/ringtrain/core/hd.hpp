#pragma once
// RT_HD marks functions compiled for both host and device, so element-wise math
// (reductions, casts, optimizer updates) is written once for both backends.
#if defined(__CUDACC__)
#define RT_HD __host__ __device__ __forceinline__
#else
#define RT_HD inline
#endif
