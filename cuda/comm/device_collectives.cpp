// DeviceCollectives: the host path's ring/tree/chain algorithms run over the
// device transport and reducer; Algorithm::mpi is MPI_Allreduce on device
// pointers (CUDA-aware MPI) or staged whole through pinned memory, completed
// by wait_bounded() like every other MPI wait (comm/bounded_wait.hpp).
#include "ringtrain/comm/algorithms.hpp"
#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/cuda/check.hpp"
#include "ringtrain/cuda/collectives.hpp"
#include "ringtrain/cuda/kernels.hpp"
#include "ringtrain/cuda/mpi_support.hpp"

namespace ringtrain::cuda {
namespace {

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;  // f16/bf16: MPI has no arithmetic for them
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::max: return MPI_MAX;
    default: return MPI_SUM;
  }
}

}  // namespace

DeviceCollectives::DeviceCollectives(CudaContext& ctx)
    : ctx_(ctx), cuda_aware_(use_device_pointers_in_mpi()), reducer_(ctx.comm()), ws_(ctx.device_index()) {}

DeviceCollectives::~DeviceCollectives() { cudaStreamSynchronize(ctx_.comm()); }

// The buffers may have been written by the compute stream: the comm stream
// waits for it (an event). MPI reads device memory directly only on the
// CUDA-aware path, which therefore also waits on the host, once per call.
void DeviceCollectives::enter() {
  ctx_.stream_wait(ctx_.comm(), ctx_.compute());
  if (cuda_aware_) RT_CUDA(cudaStreamSynchronize(ctx_.comm()));
}

void DeviceCollectives::check_device(const CollectiveOptions& opt, const char* what) const {
  RT_CHECK(opt.device.is_cuda() && opt.device.index == ctx_.device_index(), what, ": buffers on ", opt.device.str(),
           " but this DeviceCollectives serves cuda:", ctx_.device_index());
}

// Runs `algo(P)` over this rank's device transport on `comm`, then waits for the comm stream.
template <typename F>
void DeviceCollectives::run(const Communicator& comm, int tag, const char* what, DType dtype, ReduceOp op,
                            const CollectiveOptions& opt, F&& algo) {
  MPI_Comm mc = comm.handle(what);
  const HostCommContext& hc = host_context(mc, comm.local_size());  // spin, read once per communicator
  MpiTransport mpi(mc, tag, what, comm.name().c_str(), comm.timeout_s(), hc.spin_s);
  StagedTransport staged(mpi, pool_, ctx_.comm());
  CudaAwareTransport aware(mpi, ctx_.comm());
  Transport& t = cuda_aware_ ? static_cast<Transport&>(aware) : static_cast<Transport&>(staged);
  Primitives::Config cfg;
  cfg.dtype = dtype;
  cfg.op = op;
  cfg.segment_bytes = effective_segment_bytes(opt);
  {
    Primitives P(t, reducer_, ws_, cfg);
    algo(P);
    P.finish();
  }
  RT_CUDA(cudaStreamSynchronize(ctx_.comm()));  // the last H2D copies / reductions
}

void DeviceCollectives::mpi_allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                      const Communicator& comm) {
  const WaitOn on(comm, "allreduce");
  MPI_Datatype t = mpi_type(dtype);
  std::size_t bytes = count * dtype_size(dtype);
  RT_CHECK(count <= static_cast<std::size_t>(INT32_MAX), "allreduce: count ", count, " too large for MPI");
  cudaStream_t s = ctx_.comm();
  if (cuda_aware_) {
    RT_CUDA(cudaStreamSynchronize(s));
    MPI_Request req;
    check_mpi(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count), t, mpi_op(op), on.comm,
                             &req),
              "allreduce (algorithm mpi)", "MPI_Iallreduce");
    wait_bounded(&req, 1, on, "allreduce (algorithm mpi)");
  } else {
    whole_.reserve(bytes);
    RT_CUDA(cudaMemcpyAsync(whole_.data(), send, bytes, cudaMemcpyDeviceToHost, s));
    RT_CUDA(cudaStreamSynchronize(s));
    bounded::allreduce(whole_.data(), static_cast<int>(count), t, mpi_op(op), on, "allreduce (algorithm mpi)");
    RT_CUDA(cudaMemcpyAsync(recv, whole_.data(), bytes, cudaMemcpyHostToDevice, s));
  }
  if (op == ReduceOp::avg) cuda::divide(recv, count, dtype, comm.size(), s);
}

void DeviceCollectives::allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                  const Communicator& comm, const CollectiveOptions& opt) {
  check_device(opt, "allreduce");
  RT_CHECK(count == 0 || (send && recv), "allreduce: null device buffer with count ", count);
  RT_CHECK(dtype != DType::u8, "allreduce: dtype uint8 is not a collective dtype");
  if (count == 0) return;
  ctx_.make_current();
  enter();
  const int p = comm.size();
  const std::size_t bytes = count * dtype_size(dtype);
  Algorithm algo = choose_algorithm(bytes, p, opt);
  if (algo == Algorithm::mpi && mpi_type(dtype) == MPI_DATATYPE_NULL) algo = Algorithm::ring;
  if (p == 1) {
    if (send != recv) RT_CUDA(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, ctx_.comm()));
    RT_CUDA(cudaStreamSynchronize(ctx_.comm()));
    return;
  }
  if (algo == Algorithm::mpi) {
    mpi_allreduce(send, recv, count, dtype, op, comm);
    RT_CUDA(cudaStreamSynchronize(ctx_.comm()));
    return;
  }
  const bool tree = algo == Algorithm::tree;
  const int divisor = op == ReduceOp::avg ? p : 1;
  run(comm, tree ? kTagTree : kTagRing, "allreduce", dtype, op, opt, [&](Primitives& P) {
    if (tree) tree_allreduce(P, send, recv, count, divisor);
    else ring_allreduce(P, send, recv, count, divisor);
  });
}

void DeviceCollectives::broadcast(void* buf, std::size_t count, DType dtype, int root, const Communicator& comm,
                                  const CollectiveOptions& opt) {
  check_device(opt, "broadcast");
  RT_CHECK(root >= 0 && root < comm.size(), "broadcast: root ", root, " out of range for ", comm.size(), " ranks");
  if (count == 0 || comm.size() == 1) return;
  ctx_.make_current();
  enter();
  const std::size_t bytes = count * dtype_size(dtype);
  run(comm, kTagBroadcast, "broadcast", dtype, ReduceOp::sum, opt, [&](Primitives& P) {
    if (bytes <= static_cast<std::size_t>(effective_tree_threshold(opt))) binomial_broadcast(P, buf, count, root);
    else chain_broadcast(P, buf, count, root);
  });
}

// The ring serves every size and every algorithm setting here: an all-gather
// has nothing to combine, and comm.algorithm = mpi's host staging would only
// add a whole-message copy each way.
void DeviceCollectives::allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype,
                                   const Communicator& comm, const CollectiveOptions& opt) {
  check_device(opt, "allgatherv");
  const int p = comm.size(), r = comm.rank();
  RT_CHECK(static_cast<int>(counts.size()) == p, "allgatherv: counts has ", counts.size(), " entries for ", p,
           " ranks");
  std::size_t off = 0, total = 0;
  for (int i = 0; i < p; ++i) {
    if (i == r) off = total;
    total += counts[static_cast<std::size_t>(i)];
  }
  RT_CHECK(total == 0 || recv, "allgatherv: null device receive buffer for ", total, " elements");
  if (total == 0) return;
  ctx_.make_current();
  enter();
  const std::size_t es = dtype_size(dtype), mine = counts[static_cast<std::size_t>(r)] * es;
  char* at = static_cast<char*>(recv) + off * es;
  if (mine && send != at) RT_CUDA(cudaMemcpyAsync(at, send, mine, cudaMemcpyDeviceToDevice, ctx_.comm()));
  if (p == 1) {
    RT_CUDA(cudaStreamSynchronize(ctx_.comm()));
    return;
  }
  if (cuda_aware_) RT_CUDA(cudaStreamSynchronize(ctx_.comm()));  // MPI reads the block copied above
  run(comm, kTagAllgather, "allgatherv", dtype, ReduceOp::sum, opt,
      [&](Primitives& P) { ring_allgatherv(P, recv, counts); });
}

void DeviceCollectives::reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts,
                                       DType dtype, ReduceOp op, const Communicator& comm,
                                       const CollectiveOptions& opt) {
  check_device(opt, "reduce_scatter");
  const int p = comm.size();
  RT_CHECK(static_cast<int>(counts.size()) == p, "reduce_scatter: counts has ", counts.size(), " entries for ", p,
           " ranks");
  RT_CHECK(dtype != DType::u8, "reduce_scatter: dtype uint8 is not a collective dtype");
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  if (total == 0) return;
  ctx_.make_current();
  enter();
  const int divisor = op == ReduceOp::avg ? p : 1;
  run(comm, kTagReduceScatter, "reduce_scatter", dtype, op, opt,
      [&](Primitives& P) { ring_reduce_scatter(P, send, recv, counts, divisor); });
}

}  // namespace ringtrain::cuda
