// Linear on OpenBLAS sgemm: y = x w^T + b (ReLU fused in the bias pass);
// dx = dy w; dw (+)= dy^T x with beta = accumulate; db (+)= column sums of dy.
#include <cblas.h>

#include "cpu_backend.hpp"

namespace ringtrain::cpu {
namespace {

class CpuLinear final : public LinearKernel {
 public:
  CpuLinear(const LinearSpec& s) : s_(s) {
    RT_CHECK(s.dtype == DType::f32, "cpu Linear: only float32 is supported, got ", dtype_name(s.dtype));
  }

  void forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) override {
    const blasint n = static_cast<blasint>(x.dim(0)), in = static_cast<blasint>(s_.in_features),
                  out = static_cast<blasint>(s_.out_features);
    float* py = y.data<float>();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.f, x.data<float>(), in, w.data<float>(), in,
                0.f, py, out);
    if (!s_.bias && !s_.fuse_relu) return;
    const float* pb = s_.bias ? b.data<float>() : nullptr;
    const bool relu = s_.fuse_relu;
#pragma omp parallel for schedule(static)
    for (blasint i = 0; i < n; ++i) {
      float* row = py + static_cast<std::int64_t>(i) * out;
      for (blasint j = 0; j < out; ++j) {
        float v = row[j] + (pb ? pb[j] : 0.f);
        row[j] = relu && v < 0.f ? 0.f : v;
      }
    }
  }

  void backward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& dy, Tensor& dx, Tensor& dw,
                Tensor& db, bool accumulate) override {
    const blasint n = static_cast<blasint>(x.dim(0)), in = static_cast<blasint>(s_.in_features),
                  out = static_cast<blasint>(s_.out_features);
    const float* g = dy.data<float>();
    if (s_.fuse_relu) {
      if (masked_.numel() != dy.numel()) masked_ = Tensor::empty(dy.shape());
      relu_mask(y.data<float>(), g, masked_.data<float>(), dy.numel());
      g = masked_.data<float>();
    }
    if (dx.defined())
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.f, g, out, w.data<float>(), in, 0.f,
                  dx.data<float>(), in);
    if (!dw.defined()) return;  // input half of a split backward
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.f, g, out, x.data<float>(), in,
                accumulate ? 1.f : 0.f, dw.data<float>(), in);
    if (s_.bias) {
      float* pdb = db.data<float>();
      if (!accumulate)
        for (blasint j = 0; j < out; ++j) pdb[j] = 0.f;
      for (blasint i = 0; i < n; ++i) {
        const float* row = g + static_cast<std::int64_t>(i) * out;
#pragma omp simd
        for (blasint j = 0; j < out; ++j) pdb[j] += row[j];
      }
    }
  }

 private:
  LinearSpec s_;
  Tensor masked_;
};

}  // namespace

std::unique_ptr<LinearKernel> make_linear(const LinearSpec& s, DnnlPtr) { return std::make_unique<CpuLinear>(s); }

}  // namespace ringtrain::cpu
