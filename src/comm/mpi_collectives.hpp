#pragma once
// Algorithm `mpi`: the MPI library's own collectives, for comparison and as a
// fallback. float16/bfloat16 travel as MPI_UINT16_T with user-defined ops that
// run CpuReducer's kernels (float32 accumulation, like ours). avg is MPI's sum
// followed by one local division, identical on every rank. Each is the
// non-blocking call completed by wait_bounded() (comm/bounded_wait.hpp): a rank
// that never arrives ends the job after `on.timeout_s`, named.
#include <mpi.h>

#include <cstddef>
#include <vector>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/reduce_math.hpp"

namespace ringtrain::mpi_impl {

void allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const WaitOn& on,
               const char* what);
void broadcast(void* buf, std::size_t count, DType dtype, int root, const WaitOn& on, const char* what);
void allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype, const WaitOn& on,
                const char* what);
void reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype,
                    ReduceOp op, const WaitOn& on, const char* what);

}  // namespace ringtrain::mpi_impl
