// Device-buffer collectives against MPI_Allreduce on host copies, at 1-4 ranks
// (ranks may share one GPU): every collective dtype and op, ring, tree and
// mpi algorithms, in place and out of place, sizes around segment and chunk
// boundaries; the host-staged transport is always tested, CUDA-aware MPI when
// the library reports it. Broadcast against MPI_Bcast.
#include <mpi.h>

#include <cstring>

#include "gpu_test_util.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/cuda/collectives.hpp"
#include "ringtrain/cuda/context.hpp"

using namespace ringtrain;
using namespace rt_gpu;

namespace {

MPI_Datatype mpi_of(DType dt) {
  switch (dt) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    default: return MPI_INT64_T;
  }
}

// Host reference: MPI_Allreduce on the host copy; avg = sum then one division.
template <typename T>
std::vector<T> reference(const std::vector<T>& mine, ReduceOp op, int p) {
  std::vector<T> out(mine.size());
  MPI_Op mop = op == ReduceOp::min ? MPI_MIN : op == ReduceOp::max ? MPI_MAX : MPI_SUM;
  MPI_Allreduce(mine.data(), out.data(), static_cast<int>(mine.size()), mpi_of(dtype_of<T>::value), mop, MPI_COMM_WORLD);
  if (op == ReduceOp::avg)
    for (auto& v : out) v = static_cast<T>(v / static_cast<T>(p));
  return out;
}

template <typename T>
void run_case(cuda::DeviceCollectives& dc, const Communicator& comm, std::size_t n, ReduceOp op, Algorithm algo,
              bool in_place) {
  const int r = comm.rank(), p = comm.size();
  std::vector<T> mine(n);
  for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<T>(static_cast<long long>((i * 131 + r * 977) % 2001) - 1000);
  auto ref = reference(mine, op, p);
  Tensor send = Tensor::empty({static_cast<std::int64_t>(n)}, dtype_of<T>::value, gpu());
  copy_bytes(send.raw(), gpu(), mine.data(), Device::cpu(), n * sizeof(T));
  Tensor recv = in_place ? send : Tensor::zeros({static_cast<std::int64_t>(n)}, dtype_of<T>::value, gpu());
  CollectiveOptions opt;
  opt.algorithm = algo;
  opt.device = gpu();
  opt.segment_bytes = 4096;  // many segments: exercises the pipelining
  dc.allreduce(send.raw(), recv.raw(), n, dtype_of<T>::value, op, comm, opt);
  std::vector<T> got(n);
  copy_bytes(got.data(), Device::cpu(), recv.raw(), gpu(), n * sizeof(T));
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_integral_v<T>) {
      ASSERT_EQ(got[i], ref[i]) << "i=" << i << " n=" << n << " algo=" << algorithm_name(algo);
    } else {
      // Integer-valued inputs: sums are exact, avg rounds once.
      ASSERT_NEAR(got[i], ref[i], 1e-6 * std::fabs(static_cast<double>(ref[i])) + 1e-12)
          << "i=" << i << " n=" << n << " algo=" << algorithm_name(algo);
    }
  }
}

template <typename T>
void run_half(cuda::DeviceCollectives& dc, const Communicator& comm, ReduceOp op) {
  // f16/bf16 have no MPI type: reduce small integers (exact in both) and compare.
  const int r = comm.rank(), p = comm.size();
  const std::size_t n = 5000;
  std::vector<T> mine(n);
  std::vector<float> mine_f(n);
  for (std::size_t i = 0; i < n; ++i) {
    mine_f[i] = static_cast<float>(static_cast<int>((i * 7 + r * 13) % 33) - 16);
    if constexpr (std::is_same_v<T, float16>) mine[i] = to_f16(mine_f[i]);
    else mine[i] = to_bf16(mine_f[i]);
  }
  std::vector<float> ref(n);
  MPI_Op mop = op == ReduceOp::min ? MPI_MIN : op == ReduceOp::max ? MPI_MAX : MPI_SUM;
  MPI_Allreduce(mine_f.data(), ref.data(), static_cast<int>(n), MPI_FLOAT, mop, MPI_COMM_WORLD);
  Tensor buf = Tensor::empty({static_cast<std::int64_t>(n)}, dtype_of<T>::value, gpu());
  copy_bytes(buf.raw(), gpu(), mine.data(), Device::cpu(), n * sizeof(T));
  CollectiveOptions opt;
  opt.device = gpu();
  opt.algorithm = Algorithm::ring;
  opt.segment_bytes = 2048;
  dc.allreduce(buf.raw(), buf.raw(), n, dtype_of<T>::value, op, comm, opt);
  auto got = host_f32(buf);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], ref[i]) << "i=" << i << " (" << p << " ranks)";
}

}  // namespace

TEST(DeviceCollectives, AllreduceMatchesMpiOnHostCopies) {
  Communicator comm = Communicator::world();
  int dev = cuda::select_device(comm);
  cuda::CudaContext ctx(dev);
  cuda::DeviceCollectives dc(ctx);
  if (comm.rank() == 0) std::printf("CUDA-aware MPI: %s\n", dc.cuda_aware() ? "yes" : "no (pinned staging)");
  for (Algorithm algo : {Algorithm::ring, Algorithm::tree, Algorithm::mpi})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max})
      for (std::size_t n : {std::size_t{1}, std::size_t{1023}, std::size_t{70001}}) {
        for (bool in_place : {false, true}) {
          run_case<float>(dc, comm, n, op, algo, in_place);
          run_case<std::int64_t>(dc, comm, n, op, algo, in_place);
        }
        run_case<double>(dc, comm, n, op, algo, false);
        run_case<std::int32_t>(dc, comm, n, op, algo, true);
      }
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max}) {
    run_half<float16>(dc, comm, op);
    run_half<bfloat16>(dc, comm, op);
  }
}

TEST(DeviceCollectives, BroadcastMatchesMpiBcast) {
  Communicator comm = Communicator::world();
  cuda::CudaContext ctx(cuda::select_device(comm));
  cuda::DeviceCollectives dc(ctx);
  for (std::size_t n : {std::size_t{10}, std::size_t{300000}}) {
    int root = comm.size() - 1;
    std::vector<float> v(n), ref(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = ref[i] = static_cast<float>(i * (comm.rank() + 1));
    MPI_Bcast(ref.data(), static_cast<int>(n), MPI_FLOAT, root, MPI_COMM_WORLD);
    Tensor buf = Tensor::empty({static_cast<std::int64_t>(n)}, DType::f32, gpu());
    copy_bytes(buf.raw(), gpu(), v.data(), Device::cpu(), n * 4);
    CollectiveOptions opt;
    opt.device = gpu();
    opt.segment_bytes = 8192;
    dc.broadcast(buf.raw(), n, DType::f32, root, comm, opt);
    EXPECT_EQ(host_f32(buf), ref);
  }
}

TEST(DeviceCollectives, BadArgumentsAreErrors) {
  Communicator comm = Communicator::world();
  cuda::CudaContext ctx(cuda::select_device(comm));
  cuda::DeviceCollectives dc(ctx);
  CollectiveOptions host;  // device = cpu: wrong for device collectives
  float x = 0;
  EXPECT_THROW(dc.allreduce(&x, &x, 1, DType::f32, ReduceOp::sum, comm, host), Error);
  CollectiveOptions opt;
  opt.device = gpu();
  EXPECT_THROW(dc.allreduce(nullptr, nullptr, 5, DType::f32, ReduceOp::sum, comm, opt), Error);
  EXPECT_THROW(dc.broadcast(nullptr, 5, DType::f32, comm.size(), comm, opt), Error);
}

TEST(DeviceCollectives, PublicApiDispatchesDeviceBuffers) {
  // ringtrain::allreduce/broadcast with opt.device = cuda:i reach the device
  // collectives the CUDA backend registered (the same ring/tree code).
  Communicator comm = Communicator::world();
  int dev = cuda::select_device(comm);
  const std::size_t n = 100000;
  std::vector<float> mine(n);
  for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<float>((i + 3 * comm.rank()) % 101);
  std::vector<float> ref(n);
  MPI_Allreduce(mine.data(), ref.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  Tensor buf = Tensor::empty({static_cast<std::int64_t>(n)}, DType::f32, Device::cuda(dev));
  copy_bytes(buf.raw(), buf.device(), mine.data(), Device::cpu(), n * 4);
  CollectiveOptions opt;
  opt.device = Device::cuda(dev);
  for (Algorithm a : {Algorithm::automatic, Algorithm::ring, Algorithm::tree}) {
    opt.algorithm = a;
    copy_bytes(buf.raw(), buf.device(), mine.data(), Device::cpu(), n * 4);
    allreduce(buf.raw(), buf.raw(), n, DType::f32, ReduceOp::sum, comm, opt);
    EXPECT_EQ(host_f32(buf), ref) << algorithm_name(a);
  }
  broadcast(buf.raw(), n, DType::f32, 0, comm, opt);
  EXPECT_EQ(host_f32(buf), ref);
}

// ringtrain::allgather(v)/reduce_scatter on device buffers (the tensor
// group's sequence collectives and ZeRO's) against MPI_Allgatherv and
// MPI_Reduce_scatter on host copies: unequal counts with an empty block,
// segments small enough to pipeline, in place (allgather from the receive
// buffer's own block) and out of place. Integer-valued floats: exact sums.
TEST(DeviceCollectives, AllgathervAndReduceScatterMatchMpi) {
  Communicator comm = Communicator::world();
  const int p = comm.size(), r = comm.rank();
  const Device dev = Device::cuda(cuda::select_device(comm));
  for (std::size_t base : {std::size_t{7}, std::size_t{70001}}) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(p));
    std::vector<int> icounts(static_cast<std::size_t>(p)), displs(static_cast<std::size_t>(p));
    std::size_t total = 0;
    for (int i = 0; i < p; ++i) {
      counts[std::size_t(i)] = (p > 1 && i == 1) ? 0 : base + std::size_t(i) * 3;
      icounts[std::size_t(i)] = int(counts[std::size_t(i)]);
      displs[std::size_t(i)] = int(total);
      total += counts[std::size_t(i)];
    }
    CollectiveOptions opt;
    opt.device = dev;
    opt.segment_bytes = 4096;
    // all-gather
    std::vector<float> mine(counts[std::size_t(r)]), ref(total);
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = float((i * 7 + std::size_t(r) * 1000) % 4093);
    MPI_Allgatherv(mine.data(), icounts[std::size_t(r)], MPI_FLOAT, ref.data(), icounts.data(), displs.data(),
                   MPI_FLOAT, MPI_COMM_WORLD);
    for (bool in_place : {false, true}) {
      Tensor out = Tensor::zeros({std::int64_t(total)}, DType::f32, dev);
      Tensor send = in_place ? out.flat_view(displs[std::size_t(r)], std::int64_t(mine.size()))
                             : Tensor::empty({std::int64_t(std::max<std::size_t>(1, mine.size()))}, DType::f32, dev);
      if (!mine.empty()) copy_bytes(send.raw(), dev, mine.data(), Device::cpu(), mine.size() * 4);
      allgatherv(send.raw(), out.raw(), counts, DType::f32, comm, opt);
      EXPECT_EQ(host_f32(out), ref) << "allgatherv, base " << base << (in_place ? ", in place" : "");
    }
    if (base == 7) {  // the uniform call
      std::vector<float> one(5, float(r + 1)), all(std::size_t(5 * p));
      MPI_Allgather(one.data(), 5, MPI_FLOAT, all.data(), 5, MPI_FLOAT, MPI_COMM_WORLD);
      Tensor s = Tensor::empty({5}, DType::f32, dev), o = Tensor::zeros({5 * p}, DType::f32, dev);
      copy_bytes(s.raw(), dev, one.data(), Device::cpu(), 20);
      allgather(s.raw(), 5, o.raw(), DType::f32, comm, opt);
      EXPECT_EQ(host_f32(o), all) << "allgather";
    }
    // reduce-scatter
    std::vector<float> whole(total), got_ref(std::max<std::size_t>(1, counts[std::size_t(r)]));
    for (std::size_t i = 0; i < total; ++i) whole[i] = float((i * 13 + std::size_t(r) * 101) % 997);
    MPI_Reduce_scatter(whole.data(), got_ref.data(), icounts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    got_ref.resize(counts[std::size_t(r)]);
    Tensor in = Tensor::empty({std::int64_t(total)}, DType::f32, dev);
    copy_bytes(in.raw(), dev, whole.data(), Device::cpu(), total * 4);
    Tensor out = Tensor::zeros({std::int64_t(std::max<std::size_t>(1, counts[std::size_t(r)]))}, DType::f32, dev);
    reduce_scatter(in.raw(), out.raw(), counts, DType::f32, ReduceOp::sum, comm, opt);
    std::vector<float> got = host_f32(out);
    got.resize(counts[std::size_t(r)]);
    EXPECT_EQ(got, got_ref) << "reduce_scatter, base " << base;
  }
}
