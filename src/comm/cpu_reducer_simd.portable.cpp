// No explicit SIMD reduction kernels off x86-64: the portable loops
// (cpu_reducer.cpp), which the compiler vectorises for the target, serve all.
#include "cpu_reducer_kernels.hpp"

namespace ringtrain {

ReduceKernel simd_reduce_kernel(ReduceOp, DType, bool) { return nullptr; }

}  // namespace ringtrain
