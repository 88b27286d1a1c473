// Our CUDA kernels against independent host references: reductions for every
// collective dtype and op, casts (bitwise vs core/dtype.hpp), softmax
// cross-entropy with label smoothing (double-precision host formula), dropout
// masks (nn/rng.hpp rule), non-finite detection, batched copy (memcpy on odd
// sizes and alignments), dynamic loss scaling, and the caching allocator.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <limits>

#include "gpu_test_util.hpp"
#include "ringtrain/comm/reduce_math.hpp"
#include "ringtrain/cuda/context.hpp"
#include "ringtrain/cuda/kernels.hpp"
#include "ringtrain/cuda/memory.hpp"
#include "ringtrain/nn/rng.hpp"

using namespace ringtrain;
using namespace rt_gpu;

namespace {

// Device buffer holding the raw bytes of a host vector.
template <typename T>
Tensor upload(const std::vector<T>& v) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, dtype_of<T>::value, gpu());
  copy_bytes(t.raw(), gpu(), v.data(), Device::cpu(), v.size() * sizeof(T));
  return t;
}
template <typename T>
std::vector<T> download(const Tensor& t) {
  std::vector<T> v(static_cast<std::size_t>(t.numel()));
  copy_bytes(v.data(), Device::cpu(), t.raw(), gpu(), v.size() * sizeof(T));
  return v;
}

template <typename T>
T make_value(std::mt19937& g) {
  std::uniform_int_distribution<int> d(-1000, 1000);
  if constexpr (std::is_same_v<T, float16>) return to_f16(d(g) / 64.0f);
  else if constexpr (std::is_same_v<T, bfloat16>) return to_bf16(d(g) / 64.0f);
  else if constexpr (std::is_integral_v<T>) return static_cast<T>(d(g));
  else return static_cast<T>(d(g) / 64.0);
}

template <typename T>
double as_double(T v) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) return to_f32(v);
  else return static_cast<double>(v);
}

// Host reference, written out directly (not via reduce_math).
template <typename T>
double ref_op(double a, double b, ReduceOp op) {
  switch (op) {
    case ReduceOp::min: return std::min(a, b);
    case ReduceOp::max: return std::max(a, b);
    default: return a + b;
  }
}

template <typename T>
void check_reduce(ReduceOp op, int divisor) {
  const std::size_t n = 100003;  // odd: tails of the grid-stride loop
  std::mt19937 g(7);
  std::vector<T> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = make_value<T>(g);
    b[i] = make_value<T>(g);
  }
  Tensor da = upload(a), db = upload(b), dd = Tensor::empty({static_cast<std::int64_t>(n)}, dtype_of<T>::value, gpu());
  cuda::reduce(dd.raw(), da.raw(), db.raw(), n, dtype_of<T>::value, op, divisor, nullptr);
  auto got = download<T>(dd);
  for (std::size_t i = 0; i < n; ++i) {
    double r = ref_op<T>(as_double(a[i]), as_double(b[i]), op);
    if (divisor > 1) r = std::is_integral_v<T> ? static_cast<double>(static_cast<long long>(r) / divisor) : r / divisor;
    // Values are multiples of 1/64 below 32: sums are exact in every float type
    // except the half types after division, which round once.
    double tol = std::is_same_v<T, float16> ? 1e-3 * std::fabs(r) : std::is_same_v<T, bfloat16> ? 8e-3 * std::fabs(r) : 1e-6 * std::fabs(r);
    ASSERT_NEAR(as_double(got[i]), r, tol) << "element " << i << " dtype " << dtype_name(dtype_of<T>::value)
                                           << " op " << static_cast<int>(op) << " divisor " << divisor;
  }
  // In place (dst == a) gives the same bytes.
  cuda::reduce(da.raw(), da.raw(), db.raw(), n, dtype_of<T>::value, op, divisor, nullptr);
  auto inplace = download<T>(da);
  EXPECT_EQ(0, std::memcmp(inplace.data(), got.data(), n * sizeof(T)));
}

}  // namespace

TEST(CudaKernels, ReduceEveryDtypeAndOp) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
    int div = op == ReduceOp::avg ? 3 : 1;
    check_reduce<float>(op, div);
    check_reduce<double>(op, div);
    check_reduce<float16>(op, div);
    check_reduce<bfloat16>(op, div);
    check_reduce<std::int32_t>(op, div);
    check_reduce<std::int64_t>(op, div);
  }
}

TEST(CudaKernels, ReduceRejectsUint8AndNull) {
  Tensor t = Tensor::zeros({16}, DType::u8, gpu());
  EXPECT_THROW(cuda::reduce(t.raw(), t.raw(), t.raw(), 16, DType::u8, ReduceOp::sum, 1, nullptr), Error);
  EXPECT_THROW(cuda::reduce(nullptr, t.raw(), t.raw(), 4, DType::f32, ReduceOp::sum, 1, nullptr), Error);
  EXPECT_THROW(cuda::divide(t.raw(), 4, DType::f32, 0, nullptr), Error);
}

TEST(CudaKernels, CastsMatchHostRoundingBitwise) {
  const std::size_t n = 1 << 16;
  std::vector<float> x(n);
  std::mt19937 g(3);
  std::uniform_real_distribution<float> d(-70000.0f, 70000.0f);
  for (auto& v : x) v = d(g) * std::ldexp(1.0f, static_cast<int>(g() % 40) - 30);  // subnormals to overflow
  x[0] = std::numeric_limits<float>::infinity();
  x[1] = std::numeric_limits<float>::quiet_NaN();
  x[2] = -0.0f;
  Tensor dx = upload(x);
  Tensor h = Tensor::empty({static_cast<std::int64_t>(n)}, DType::f16, gpu());
  Tensor b = Tensor::empty({static_cast<std::int64_t>(n)}, DType::bf16, gpu());
  cuda::cast(h.raw(), DType::f16, dx.raw(), DType::f32, n, nullptr);
  cuda::cast(b.raw(), DType::bf16, dx.raw(), DType::f32, n, nullptr);
  auto hh = download<float16>(h);
  auto bb = download<bfloat16>(b);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(hh[i].bits, to_f16(x[i]).bits) << "f32->f16 of " << x[i];
    ASSERT_EQ(bb[i].bits, to_bf16(x[i]).bits) << "f32->bf16 of " << x[i];
  }
  // And back: exact widening.
  Tensor back = Tensor::empty({static_cast<std::int64_t>(n)}, DType::f32, gpu());
  cuda::cast(back.raw(), DType::f32, h.raw(), DType::f16, n, nullptr);
  auto w = download<float>(back);
  for (std::size_t i = 3; i < n; ++i) ASSERT_EQ(f32_bits(w[i]), f32_bits(to_f32(hh[i])));
  EXPECT_THROW(cuda::cast(back.raw(), DType::u8, h.raw(), DType::f16, n, nullptr), Error);
}

TEST(CudaKernels, SoftmaxXentMatchesDoubleReference) {
  const int N = 37, C = 300;  // C > block size: strided rows
  for (float eps : {0.0f, 0.1f}) {
    Tensor logits = randu({N, C}, 11, 4.0f);
    std::vector<std::int64_t> labels(N);
    for (int i = 0; i < N; ++i) labels[i] = (i * 7919) % C;
    const float* z = logits.data<float>();
    // Host reference in double.
    double loss = 0.0;
    int correct = 0;
    std::vector<float> dref(static_cast<std::size_t>(N) * C);
    for (int r = 0; r < N; ++r) {
      const float* row = z + r * C;
      double m = *std::max_element(row, row + C);
      int am = static_cast<int>(std::max_element(row, row + C) - row);
      double se = 0.0, zs = 0.0;
      for (int c = 0; c < C; ++c) {
        se += std::exp(row[c] - m);
        zs += row[c];
      }
      double lse = m + std::log(se);
      loss += lse - (1.0 - eps) * row[labels[r]] - eps / C * zs;
      correct += am == labels[r];
      for (int c = 0; c < C; ++c) {
        double q = eps / C + (c == labels[r] ? 1.0 - eps : 0.0);
        dref[static_cast<std::size_t>(r) * C + c] = static_cast<float>((std::exp(row[c] - lse) - q) * 2.0 / N);
      }
    }
    loss /= N;
    Tensor dl = logits.to(gpu()), dlab = upload(labels);
    Tensor dgrad = Tensor::empty({N, C}, DType::f32, gpu());
    Tensor scratch = Tensor::empty({static_cast<std::int64_t>(cuda::xent_scratch_bytes(N))}, DType::u8, gpu());
    Tensor out = Tensor::zeros({4}, DType::f32, gpu());
    std::vector<float> two{2.0f};
    Tensor gs = upload(two);
    cuda::XentArgs a;
    a.logits = dl.raw();
    a.labels = dlab.raw();
    a.labels_dtype = DType::i64;
    a.rows = N;
    a.classes = C;
    a.smoothing = eps;
    a.dlogits = dgrad.raw();
    a.grad_scale = gs.device_data<float>();
    a.loss = out.device_data<float>();
    a.correct = reinterpret_cast<int*>(out.device_data<float>() + 1);
    a.bad_label = reinterpret_cast<int*>(out.device_data<float>() + 2);
    cuda::softmax_xent(a, scratch.raw(), nullptr);
    auto o = download<float>(out);
    int got_correct, bad;
    std::memcpy(&got_correct, &o[1], 4);
    std::memcpy(&bad, &o[2], 4);
    EXPECT_NEAR(o[0], loss, 1e-5 * std::fabs(loss)) << "eps " << eps;
    EXPECT_EQ(got_correct, correct);
    EXPECT_EQ(bad, 0);
    EXPECT_LE(rel_err(host_f32(dgrad), dref), 1e-5) << "eps " << eps;
  }
}

TEST(CudaKernels, XentFlagsBadLabels) {
  std::vector<float> z(6, 0.0f);
  std::vector<std::int32_t> lab{0, 5};  // 5 >= 3 classes
  Tensor dz = upload(z), dlab = upload(lab);
  Tensor scratch = Tensor::empty({64}, DType::u8, gpu());
  Tensor out = Tensor::zeros({4}, DType::f32, gpu());
  cuda::XentArgs a;
  a.logits = dz.raw();
  a.labels = dlab.raw();
  a.rows = 2;
  a.classes = 3;
  a.loss = out.device_data<float>();
  a.bad_label = reinterpret_cast<int*>(out.device_data<float>() + 2);
  cuda::softmax_xent(a, scratch.raw(), nullptr);
  auto o = download<float>(out);
  int bad;
  std::memcpy(&bad, &o[2], 4);
  EXPECT_EQ(bad, 1);
  a.smoothing = 1.5f;
  EXPECT_THROW(cuda::softmax_xent(a, scratch.raw(), nullptr), Error);
}

TEST(CudaKernels, DropoutMaskFollowsTheSharedRule) {
  const std::size_t n = 50001;
  const float p = 0.3f;
  Tensor x = randu({static_cast<std::int64_t>(n)}, 5);
  Tensor dx = x.to(gpu()), dy = Tensor::empty(x.shape(), DType::f32, gpu());
  Tensor mask = Tensor::empty(x.shape(), DType::u8, gpu());
  cuda::dropout_forward(dy.raw(), mask.device_data<std::uint8_t>(), dx.raw(), n, DType::f32, p, 1234, 9, 0, nullptr);
  auto m = download<std::uint8_t>(mask);
  auto y = host_f32(dy);
  const float* xv = x.data<float>();
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) {
    bool keep = dropout_keep(1234, 9, i, p);
    ASSERT_EQ(m[i], keep ? 1 : 0) << i;
    ASSERT_FLOAT_EQ(y[i], keep ? xv[i] * (1.0f / (1.0f - p)) : 0.0f) << i;
    kept += keep;
  }
  EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.01);
  EXPECT_THROW(cuda::dropout_forward(dy.raw(), mask.device_data<std::uint8_t>(), dx.raw(), n, DType::f32, 1.0f, 1, 0, 0, nullptr),
               Error);
}

TEST(CudaKernels, CheckFiniteFindsInfAndNaN) {
  Tensor flag = Tensor::zeros({1}, DType::i32, gpu());
  std::vector<float> v(4097, 1.0f);
  Tensor dv = upload(v);
  cuda::check_finite(dv.raw(), v.size(), DType::f32, flag.device_data<std::int32_t>(), nullptr);
  EXPECT_EQ(download<std::int32_t>(flag)[0], 0);
  v[4096] = std::numeric_limits<float>::quiet_NaN();
  dv = upload(v);
  cuda::check_finite(dv.raw(), v.size(), DType::f32, flag.device_data<std::int32_t>(), nullptr);
  EXPECT_EQ(download<std::int32_t>(flag)[0], 1);
}

TEST(CudaKernels, BatchedCopyEqualsMemcpy) {
  // Entries of odd sizes and alignments, some larger than a block's 16 KiB chunk.
  std::vector<std::size_t> sizes{1, 7, 64, 16384, 16385, 100000, 3, 40000, 0, 12};
  std::size_t total = 0;
  for (auto s : sizes) total += s + 5;
  std::vector<std::uint8_t> src(total);
  std::mt19937 g(1);
  for (auto& b : src) b = static_cast<std::uint8_t>(g());
  Tensor dsrc = upload(src), ddst = Tensor::zeros({static_cast<std::int64_t>(total)}, DType::u8, gpu());
  std::vector<cuda::CopyEntry> tab;
  std::vector<std::uint8_t> ref(total, 0);
  std::size_t so = 0, doff = 3, bytes = 0;
  for (auto s : sizes) {
    tab.push_back({static_cast<char*>(dsrc.raw()) + so, static_cast<char*>(ddst.raw()) + doff, s});
    std::memcpy(ref.data() + doff, src.data() + so, s);
    so += s + 1;
    doff += s + 2;
    bytes += s;
  }
  Tensor dtab = Tensor::empty({static_cast<std::int64_t>(tab.size() * sizeof(cuda::CopyEntry))}, DType::u8, gpu());
  copy_bytes(dtab.raw(), gpu(), tab.data(), Device::cpu(), tab.size() * sizeof(cuda::CopyEntry));
  cuda::batched_copy(static_cast<const cuda::CopyEntry*>(dtab.raw()), static_cast<int>(tab.size()), bytes, nullptr);
  auto got = download<std::uint8_t>(ddst);
  EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), total));
}

TEST(CudaKernels, UnscaleIsExactForPowersOfTwoAndFlagsOverflow) {
  cudaStream_t s = nullptr;
  std::vector<float> good(100003), bad;
  for (std::size_t i = 0; i < good.size(); ++i) good[i] = static_cast<float>(static_cast<int>(i % 2001) - 1000) * 64.0f;
  bad = good;
  bad[77777] = std::numeric_limits<float>::infinity();
  Tensor flag = Tensor::zeros({1}, DType::i32, gpu());
  Tensor g = upload(good);
  cuda::unscale_and_check(g.raw(), good.size(), DType::f32, 1.0f / 1024, flag.device_data<int>(), s);
  auto got = download<float>(g);
  for (std::size_t i = 0; i < good.size(); i += 997) ASSERT_EQ(got[i], good[i] / 1024) << i;
  EXPECT_EQ(download<std::int32_t>(flag)[0], 0);
  Tensor b = upload(bad);
  cuda::unscale_and_check(b.raw(), bad.size(), DType::f32, 0.5f, flag.device_data<int>(), s);
  EXPECT_EQ(download<std::int32_t>(flag)[0], 1);
  // bf16: the same exact power-of-two scaling in the narrow type.
  std::vector<bfloat16> hb(4096);
  for (std::size_t i = 0; i < hb.size(); ++i) hb[i] = to_bf16(static_cast<float>(i % 200) - 100.0f);
  Tensor db = upload(hb);
  Tensor f2 = Tensor::zeros({1}, DType::i32, gpu());
  cuda::unscale_and_check(db.raw(), hb.size(), DType::bf16, 0.25f, f2.device_data<int>(), s);
  auto gb = download<bfloat16>(db);
  for (std::size_t i = 0; i < hb.size(); ++i) ASSERT_EQ(to_f32(gb[i]), to_f32(hb[i]) * 0.25f) << i;
  EXPECT_EQ(download<std::int32_t>(f2)[0], 0);
}

TEST(CudaKernels, SumSquaresMatchesHostAndIsBitwiseRepeatable) {
  std::vector<float> x(1000003);
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  double ref = 0.0;
  for (auto& v : x) {
    v = d(gen);
    ref += static_cast<double>(v) * v;
  }
  Tensor dx = upload(x);
  Tensor out = Tensor::zeros({1}, DType::f64, gpu());
  Tensor scratch = Tensor::empty({static_cast<std::int64_t>(cuda::sum_squares_scratch_bytes())}, DType::u8, gpu());
  cuda::sum_squares(dx.raw(), x.size(), DType::f32, out.device_data<double>(), false, scratch.raw(), nullptr);
  double a = download<double>(out)[0];
  EXPECT_NEAR(a, ref, 1e-10 * ref);
  cuda::sum_squares(dx.raw(), x.size(), DType::f32, out.device_data<double>(), false, scratch.raw(), nullptr);
  EXPECT_EQ(download<double>(out)[0], a) << "the fixed-order sum changed between runs";
  cuda::sum_squares(dx.raw(), x.size(), DType::f32, out.device_data<double>(), true, scratch.raw(), nullptr);
  EXPECT_EQ(download<double>(out)[0], a + a) << "accumulate adds to *out";
}

TEST(CudaMemory, CachingAllocatorReusesBlocksAfterWarmup) {
  auto& a = cuda::device_allocator();
  auto step = [&] {
    std::vector<Tensor> ts;
    for (int i = 1; i <= 20; ++i) ts.push_back(Tensor::empty({i * 1000 + 3}, DType::f32, gpu()));
  };
  step();  // warm-up
  auto before = a.stats();
  for (int k = 0; k < 5; ++k) step();
  auto after = a.stats();
  EXPECT_EQ(after.device_mallocs, before.device_mallocs) << "a steady-state step called cudaMalloc";
  EXPECT_GE(after.cache_hits, before.cache_hits + 100);
  EXPECT_EQ(cuda::size_class(1), 512u);
  EXPECT_EQ(cuda::size_class((1u << 20) + 1), (1u << 20) + (1u << 17));
  EXPECT_THROW(a.deallocate(reinterpret_cast<void*>(0x1234), 4, gpu()), Error);
}

TEST(CudaMemory, SelectDeviceByLocalRankAndContext) {
  int dev = cuda::select_device(Communicator::world());
  EXPECT_EQ(dev, Communicator::world().local_rank() % cuda::device_count());
  cuda::CudaContext ctx(dev);
  EXPECT_NE(ctx.compute(), ctx.comm());
  void* w = ctx.workspace(1 << 20);
  EXPECT_EQ(ctx.workspace(1000), w);  // no growth for smaller requests
  EXPECT_THROW(ctx.workspace(ctx.workspace_limit() + 1), Error);
  EXPECT_THROW(cuda::CudaContext(cuda::device_count()), Error);
  cuda::PinnedBuffer pb(4096);
  EXPECT_NE(pb.data(), nullptr);
}
