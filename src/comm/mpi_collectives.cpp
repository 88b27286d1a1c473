#include "mpi_collectives.hpp"

#include <climits>
#include <algorithm>
#include <numeric>

#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain::mpi_impl {
namespace {

// MPI calls MPI_Op functions as inout[i] = in[i] op inout[i].
template <DType DT, ReduceOp OP>
void user_op(void* in, void* inout, int* len, MPI_Datatype*) {
  CpuReducer().reduce(inout, in, inout, static_cast<std::size_t>(*len), DT, OP, 1);
}

// Own ops for the 16-bit floats (MPI has no such types) and for uint8, whose
// built-in MPI_SUM saturates instead of wrapping in Open MPI 4.1's AVX op
// component (measured: 200 + 201 -> 255).
struct HalfOps {
  MPI_Op op[3][3];  // [f16, bf16, u8][sum, min, max]
  HalfOps() {
    MPI_Op_create(&user_op<DType::f16, ReduceOp::sum>, 1, &op[0][0]);
    MPI_Op_create(&user_op<DType::f16, ReduceOp::min>, 1, &op[0][1]);
    MPI_Op_create(&user_op<DType::f16, ReduceOp::max>, 1, &op[0][2]);
    MPI_Op_create(&user_op<DType::bf16, ReduceOp::sum>, 1, &op[1][0]);
    MPI_Op_create(&user_op<DType::bf16, ReduceOp::min>, 1, &op[1][1]);
    MPI_Op_create(&user_op<DType::bf16, ReduceOp::max>, 1, &op[1][2]);
    MPI_Op_create(&user_op<DType::u8, ReduceOp::sum>, 1, &op[2][0]);
    MPI_Op_create(&user_op<DType::u8, ReduceOp::min>, 1, &op[2][1]);
    MPI_Op_create(&user_op<DType::u8, ReduceOp::max>, 1, &op[2][2]);
  }
};

// Created on first use, immutable afterwards; MPI_Finalize releases them.
const HalfOps& half_ops() {
  static const HalfOps ops;
  return ops;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::f16:
    case DType::bf16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(DType t, ReduceOp op) {
  int k = op == ReduceOp::min ? 1 : op == ReduceOp::max ? 2 : 0;
  if (t == DType::f16) return half_ops().op[0][k];
  if (t == DType::bf16) return half_ops().op[1][k];
  if (t == DType::u8) return half_ops().op[2][k];
  return k == 1 ? MPI_MIN : k == 2 ? MPI_MAX : MPI_SUM;
}

int as_int(std::size_t n, const char* what) {
  RT_CHECK(n <= static_cast<std::size_t>(INT_MAX), what, " (algorithm mpi): count ", n,
           " exceeds MPI's int; use algorithm ring");
  return static_cast<int>(n);
}

std::vector<int> int_counts(const std::vector<std::size_t>& c, std::vector<int>* displs, const char* what) {
  std::vector<int> out(c.size());
  std::size_t total = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    out[i] = as_int(c[i], what);
    if (displs) displs->push_back(as_int(total, what));
    total += c[i];
  }
  as_int(total, what);
  return out;
}

}  // namespace

void allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const WaitOn& on,
               const char* what) {
  int n = as_int(count, what);
  const void* s = send == recv ? MPI_IN_PLACE : send;
  MPI_Request req;
  check_mpi(MPI_Iallreduce(s, recv, n, mpi_type(dtype), mpi_op(dtype, op), on.comm, &req), what, "MPI_Iallreduce");
  wait_bounded(&req, 1, on, what);
  if (op == ReduceOp::avg) {
    int p = 1;
    MPI_Comm_size(on.comm, &p);
    CpuReducer().divide(recv, count, dtype, p);
  }
}

void broadcast(void* buf, std::size_t count, DType dtype, int root, const WaitOn& on, const char* what) {
  MPI_Request req;
  check_mpi(MPI_Ibcast(buf, as_int(count, what), mpi_type(dtype), root, on.comm, &req), what, "MPI_Ibcast");
  wait_bounded(&req, 1, on, what);
}

void allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype, const WaitOn& on,
                const char* what) {
  int r = 0;
  MPI_Comm_rank(on.comm, &r);
  std::vector<int> displs;
  auto c = int_counts(counts, &displs, what);
  const char* mine = static_cast<const char*>(recv) + static_cast<std::size_t>(displs[r]) * dtype_size(dtype);
  const void* s = send == mine ? MPI_IN_PLACE : send;
  MPI_Request req;
  check_mpi(MPI_Iallgatherv(s, c[r], mpi_type(dtype), recv, c.data(), displs.data(), mpi_type(dtype), on.comm, &req),
            what, "MPI_Iallgatherv");
  wait_bounded(&req, 1, on, what);  // c and displs must outlive the request
}

void reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype,
                    ReduceOp op, const WaitOn& on, const char* what) {
  auto c = int_counts(counts, nullptr, what);
  int r = 0, p = 1;
  MPI_Comm_rank(on.comm, &r);
  MPI_Comm_size(on.comm, &p);
  // MPI forbids aliasing send and recv here (its MPI_IN_PLACE means something else).
  std::size_t es = dtype_size(dtype), total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  const char* s = static_cast<const char*>(send);
  char* d = static_cast<char*>(recv);
  bool overlap = d < s + total * es && s < d + counts[r] * es;
  std::vector<char> tmp(overlap ? counts[r] * es : 0);
  MPI_Request req;
  check_mpi(MPI_Ireduce_scatter(send, overlap ? tmp.data() : recv, c.data(), mpi_type(dtype), mpi_op(dtype, op),
                                on.comm, &req),
            what, "MPI_Ireduce_scatter");
  wait_bounded(&req, 1, on, what);
  if (overlap) std::copy(tmp.begin(), tmp.end(), d);
  if (op == ReduceOp::avg) CpuReducer().divide(recv, counts[r], dtype, p);
}

}  // namespace ringtrain::mpi_impl
