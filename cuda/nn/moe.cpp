// The CUDA backend's mixture-of-experts ops (Backend::moe_route ...
// batched_gemm; nn/moe_device.cpp calls them): argument checks, then the
// kernels of kernels/moe.cu on the compute stream. The experts' GEMMs are one
// cublasGemmStridedBatchedEx per matrix: the layer pads every local expert's
// block to one row count (the busiest expert's, rounded up to 8), so the
// batch is uniform and needs no grouped GEMM (cublasGemmGroupedBatchedEx,
// CUDA >= 12.5, would save the padding's work; not used yet). Strict float32
// (CUBLAS_COMPUTE_32F): the MoE layer has no math mode of its own.
#include "nn/common.hpp"
#include "nn/moe_ops.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda::nnimpl {
namespace {

void expect_n(const Tensor& t, DType dt, std::int64_t numel, const char* what, const char* arg) {
  expect_cuda(t, dt, what, arg);
  RT_CHECK(numel < 0 || t.numel() == numel, what, ": ", arg, " has ", t.numel(), " elements, expected ", numel);
}

}  // namespace

void moe_route(Shared& sh, Tensor& probs, const Tensor& bias, int k, Tensor& expert, Tensor& gate, Tensor& psum) {
  const char* what = "moe_route";
  expect_cuda(probs, DType::f32, what, "probs");
  RT_CHECK(probs.ndim() == 2 && k >= 1 && k <= probs.dim(1), what, ": probs must be [n, E] with k = ", k,
           " in [1, E], got ", shape_str(probs.shape()));
  MoeRoute a;
  a.n = probs.dim(0);
  a.E = static_cast<int>(probs.dim(1));
  a.k = k;
  expect_n(expert, DType::i32, a.n * k, what, "expert");
  expect_n(gate, DType::f32, a.n * k, what, "gate");
  expect_n(psum, DType::f64, a.E, what, "psum");
  if (bias.defined()) expect_n(bias, DType::f32, a.E, what, "bias");
  a.probs = probs.device_data<float>();
  a.bias = bias.defined() ? bias.device_data<float>() : nullptr;
  a.expert = expert.device_data<std::int32_t>();
  a.gate = gate.device_data<float>();
  a.psum = psum.device_data<double>();
  cuda::moe_route(a, sh.ctx(probs).compute());
}

void moe_gather_rows(Shared& sh, const Tensor& src, const Tensor& idx, Tensor& dst) {
  const char* what = "moe_gather_rows";
  const std::int64_t m = idx.numel();
  if (m == 0) return;
  expect_n(idx, DType::i64, -1, what, "idx");
  expect_cuda(dst, DType::f32, what, "dst");
  RT_CHECK(dst.numel() % m == 0, what, ": dst ", shape_str(dst.shape()), " is not ", m, " rows");
  const std::int64_t D = dst.numel() / m;
  const float* s = nullptr;
  if (src.numel() > 0) {
    expect_cuda(src, DType::f32, what, "src");
    s = src.device_data<float>();
  }
  cuda::moe_gather_rows(s, idx.device_data<std::int64_t>(), dst.device_data<float>(), m, D, sh.ctx(dst).compute());
}

void moe_combine(Shared& sh, const Tensor& rows, const Tensor& row, const Tensor& gate, int k, const Tensor& tokens,
                 Tensor& y, bool accumulate) {
  const char* what = "moe_combine";
  expect_cuda(y, DType::f32, what, "y");
  MoeCombine a;
  a.D = y.dim(-1);
  a.k = k;
  a.accumulate = accumulate;
  const std::int64_t n = y.numel() / a.D;
  expect_n(row, DType::i64, n * k, what, "row");
  if (gate.defined()) expect_n(gate, DType::f32, n * k, what, "gate");
  if (tokens.defined() && tokens.numel() > 0) expect_n(tokens, DType::i64, -1, what, "tokens");
  if (rows.numel() > 0) {
    expect_cuda(rows, DType::f32, what, "rows");
    a.rows = rows.device_data<float>();
  }
  a.row = row.device_data<std::int64_t>();
  a.gate = gate.defined() ? gate.device_data<float>() : nullptr;
  a.tokens = tokens.defined() && tokens.numel() > 0 ? tokens.device_data<std::int64_t>() : nullptr;
  a.y = y.device_data<float>();
  cuda::moe_combine(a, tokens.defined() ? tokens.numel() : n, sh.ctx(y).compute());
}

void moe_combine_backward(Shared& sh, const Tensor& dy, const Tensor& rows, const Tensor& row, const Tensor& gate,
                          int k, Tensor& dgate, Tensor& drows) {
  const char* what = "moe_combine_backward";
  expect_cuda(dy, DType::f32, what, "dy");
  MoeCombine a;
  a.D = dy.dim(-1);
  a.k = k;
  const std::int64_t n = dy.numel() / a.D;
  expect_n(row, DType::i64, n * k, what, "row");
  expect_n(gate, DType::f32, n * k, what, "gate");
  expect_n(dgate, DType::f32, n * k, what, "dgate");
  float* dr = nullptr;
  if (rows.numel() > 0) {
    expect_cuda(rows, DType::f32, what, "rows");
    expect_n(drows, DType::f32, rows.numel(), what, "drows");
    a.rows = rows.device_data<float>();
    dr = drows.device_data<float>();
  }
  a.row = row.device_data<std::int64_t>();
  a.gate = gate.device_data<float>();
  cuda::moe_combine_backward(a, n, dy.device_data<float>(), dgate.device_data<float>(), dr, sh.ctx(dy).compute());
}

void moe_router_backward(Shared& sh, const Tensor& probs, const Tensor& expert, const Tensor& gate,
                         const Tensor& dgate, const Tensor& f, double aux_g, Tensor& dlogit) {
  const char* what = "moe_router_backward";
  expect_cuda(probs, DType::f32, what, "probs");
  RT_CHECK(probs.ndim() == 2, what, ": probs must be [n, E], got ", shape_str(probs.shape()));
  MoeRouterBackward a;
  a.n = probs.dim(0);
  a.E = static_cast<int>(probs.dim(1));
  a.k = a.n > 0 ? static_cast<int>(expert.numel() / a.n) : 1;
  expect_n(expert, DType::i32, a.n * a.k, what, "expert");
  expect_n(gate, DType::f32, a.n * a.k, what, "gate");
  expect_n(dgate, DType::f32, a.n * a.k, what, "dgate");
  expect_n(f, DType::f32, a.E, what, "f");
  expect_n(dlogit, DType::f32, a.n * a.E, what, "dlogit");
  a.probs = probs.device_data<float>();
  a.expert = expert.device_data<std::int32_t>();
  a.gate = gate.device_data<float>();
  a.dgate = dgate.device_data<float>();
  a.f = f.device_data<float>();
  a.aux_g = aux_g;
  a.dlogit = dlogit.device_data<float>();
  cuda::moe_router_backward(a, sh.ctx(probs).compute());
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B first.
void batched_gemm(Shared& sh, Device dev, const Backend::BatchedGemm& g) {
  RT_CHECK(dev.kind == DeviceKind::cuda, "batched_gemm: the CUDA backend got ", dev.str());
  RT_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1 && g.m <= INT32_MAX && g.n <= INT32_MAX &&
               g.k <= INT32_MAX && g.batch <= INT32_MAX,
           "batched_gemm: ", g.batch, " x [", g.m, ", ", g.n, ", ", g.k, "] does not fit cuBLAS's int sizes");
  if (g.m == 0 || g.n == 0) return;
  CudaContext& c = sh.ctx(dev.index);
  if (g.k == 0) {  // cuBLAS's k = 0 is C = beta C; zero it explicitly as the CPU does
    RT_CHECK(g.beta == 0 || g.beta == 1, "batched_gemm: k = 0 with beta ", g.beta);
    if (g.beta == 0)
      for (std::int64_t b = 0; b < g.batch; ++b)
        RT_CUDA(cudaMemset2DAsync(g.c + b * g.sc, std::size_t(g.ldc) * 4, 0, std::size_t(g.n) * 4,
                                  std::size_t(g.m), c.compute()));
    return;
  }
  RT_CUBLAS(cublasGemmStridedBatchedEx(c.cublas(), g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, g.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       int(g.n), int(g.m), int(g.k), &g.alpha, g.b, CUDA_R_32F, int(g.ldb), g.sb, g.a,
                                       CUDA_R_32F, int(g.lda), g.sa, &g.beta, g.c, CUDA_R_32F, int(g.ldc), g.sc,
                                       int(g.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace ringtrain::cuda::nnimpl
