// The fusion engine on device tensors (the trainer's path on a GPU): many
// tensors of mixed dtypes and sizes fused into a device fusion buffer, packed
// and unpacked by one batched-copy kernel, reduced by the device collectives,
// against MPI_Allreduce on host copies (bitwise: the averaging is the same
// float32 multiply as on the host) and across ranks; fp16 compression within
// float16 rounding.
#include <cmath>

#include "engine/engine_test_util.hpp"
#include "ringtrain/parallel/device_runtime.hpp"

using namespace ringtrain;
using namespace rt_test;

namespace {

struct Case {
  std::string name;
  std::int64_t n;
  DType dtype;
};

std::vector<Case> cases() {
  std::vector<Case> cs;
  int k = 0;
  for (std::int64_t n : {1, 3, 1000, 4097, 70001})
    for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32})
      cs.push_back({cat("grad", k++, ".", dtype_name(dt)), n, dt});
  return cs;
}

// An engine whose device tensors go through the CUDA runtime's fusion ops.
std::unique_ptr<Engine> device_engine(const Communicator& world, Device& dev, bool fp16) {
  DeviceRuntime& rt = device_runtime(DeviceKind::cuda);
  dev = rt.select(world);
  EngineOptions o = test_options();
  o.device_ops = rt.fusion_ops(dev);
  o.fp16_allreduce = fp16;
  return std::make_unique<Engine>(world, o);
}

}  // namespace

TEST(GpuEngine, FusedDeviceTensorsMatchMpiAllreduce) {
  Communicator world = Communicator::world();
  Device dev;
  auto engine = device_engine(world, dev, false);
  Engine& eng = *engine;
  const auto cs = cases();
  for (int round = 0; round < 3; ++round)
    for (ReduceOp op : {ReduceOp::avg, ReduceOp::sum}) {
      std::vector<Tensor> host, ref, d;
      std::vector<Handle> hs;
      for (std::size_t i = 0; i < cs.size(); ++i) {
        Tensor t = Tensor::empty({cs[i].n}, cs[i].dtype);
        fill(t, [&](std::int64_t j) { return exact_value(static_cast<int>(i) + round, world_rank(), j); });
        ref.push_back(reference_allreduce(t, op));
        d.push_back(t.to(dev));
      }
      for (std::size_t i = 0; i < cs.size(); ++i) hs.push_back(eng.allreduce_async(cs[i].name, d[i], op));
      for (auto& h : hs) eng.wait(h);
      for (std::size_t i = 0; i < cs.size(); ++i) {
        Tensor got = d[i].to(Device::cpu());
        EXPECT_TRUE(same_bytes(got, ref[i])) << cs[i].name << " (" << op_name(op) << ", round " << round << ")";
        EXPECT_TRUE(identical_across_ranks(got)) << cs[i].name;
      }
    }
  EXPECT_GT(eng.stats().fused_allreduces, 0u) << "nothing was fused: the device pack/unpack path was not exercised";
}

TEST(GpuEngine, Fp16CompressionOnDeviceTensors) {
  Communicator world = Communicator::world();
  Device dev;
  auto engine = device_engine(world, dev, true);
  Engine& eng = *engine;
  std::vector<Tensor> ref, d;
  std::vector<Handle> hs;
  for (int i = 0; i < 6; ++i) {
    Tensor t = Tensor::empty({5000 + 17 * i}, DType::f32);
    fill(t, [&](std::int64_t j) { return std::sin(0.001 * static_cast<double>(j * (i + 1) + world_rank())); });
    ref.push_back(reference_allreduce(t, ReduceOp::avg));
    d.push_back(t.to(dev));
    hs.push_back(eng.allreduce_async(cat("w", i), d.back()));
  }
  for (auto& h : hs) eng.wait(h);
  for (int i = 0; i < 6; ++i) {
    Tensor got = d[static_cast<std::size_t>(i)].to(Device::cpu());
    double worst = 0;
    for (std::int64_t j = 0; j < got.numel(); ++j)
      worst = std::max(worst, static_cast<double>(std::fabs(got.data<float>()[j] - ref[static_cast<std::size_t>(i)].data<float>()[j])));
    EXPECT_LE(worst, 2e-3) << "w" << i << ": fp16 on the wire, values in [-1, 1]";
    EXPECT_TRUE(identical_across_ranks(got)) << "w" << i;
  }
}
