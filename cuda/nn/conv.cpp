// Conv2d on cuDNN: descriptors and algorithms chosen once per input shape
// (cudnnGet*_v7 heuristics, first algorithm whose workspace fits the limit),
// bias (+ fused ReLU) and the bias gradient via our kernels.
// 16-bit activation storage (Backend::bf16_images): a float32 kernel also
// takes bf16 or f16 x, y, dy, dx with the layer's 16-bit weight copy and the
// float32 bias: cuDNN's BFLOAT16/PSEUDO_HALF configurations (16-bit data,
// float32 compute) on tensor cores. The weight gradient comes out of cuDNN in
// the 16-bit type (its filter-gradient descriptor has the data's type) and is
// then cast, or cast and added, into the float32 gradient, as PyTorch's
// autocast does; the bias gradient is summed in float32 from the 16-bit dy.
#include <map>

#include "nn/common.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda::nnimpl {
namespace {

struct ConvPlan {
  TensorDesc x, y;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  std::size_t ws_fwd = 0, ws_data = 0, ws_filter = 0;
  ~ConvPlan() {
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

// The first candidate (best first) that ran, fits the workspace limit and,
// when asked, is deterministic; if no deterministic one fits, the first that
// fits (with a warning: such a run does not repeat bitwise).
template <typename Perf, typename Get>
Perf pick(Get get, int max_algos, std::size_t limit, bool deterministic, const char* what) {
  std::vector<Perf> perf(max_algos);
  int found = 0;
  RT_CUDNN(get(max_algos, &found, perf.data()));
  auto fits = [&](const Perf& p) { return p.status == CUDNN_STATUS_SUCCESS && p.memory <= limit; };
  for (int i = 0; i < found; ++i)
    if (fits(perf[i]) && (!deterministic || perf[i].determinism == CUDNN_DETERMINISTIC)) return perf[i];
  for (int i = 0; i < found; ++i)
    if (fits(perf[i])) {
      log::warn(what, ": no deterministic cuDNN algorithm fits the workspace limit; using a non-deterministic one");
      return perf[i];
    }
  RT_FAIL(what, ": no cuDNN algorithm fits the workspace limit of ", limit, " bytes");
}

class CudnnConv final : public Conv2dKernel {
 public:
  CudnnConv(SharedPtr sh, const Conv2dSpec& s) : sh_(std::move(sh)), s_(s) {
    RT_CHECK(s.in_channels > 0 && s.out_channels > 0, "conv2d: channels must be positive");
    cudnn_type(s.dtype, "conv2d");
  }

  void forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, KernelState&) override {
    const char* what = "conv2d forward";
    const DType t = act_type(x, s_.dtype, what, "x");
    expect_weight(w, t, what);
    expect_cuda(y, t, what, "y");
    CudaContext& c = sh_->ctx(x);
    ConvPlan& p = plan(x, t, c);
    float one = 1.0f, zero = 0.0f;
    double oned = 1.0, zerod = 0.0;
    const void* a1 = s_.dtype == DType::f64 ? static_cast<const void*>(&oned) : &one;
    const void* a0 = s_.dtype == DType::f64 ? static_cast<const void*>(&zerod) : &zero;
    RT_CUDNN(cudnnConvolutionForward(c.cudnn(), a1, p.x.d, x.raw(), p.w, w.raw(), p.conv, p.fwd,
                                     c.workspace(p.ws_fwd), p.ws_fwd, a0, p.y.d, y.raw()));
    // Bias (+ ReLU) in one pass of our kernel: cudnnAddTensor lacks bf16 and
    // would need a second pass for the ReLU.
    if (b.defined()) {
      expect_cuda(b, s_.dtype, what, "b");
      bias_add(y.raw(), b.raw(), y.dim(0), y.dim(1), y.dim(2) * y.dim(3), s_.fuse_relu, t, s_.dtype, c.compute());
    } else if (s_.fuse_relu) {
      relu_forward(y.raw(), y.raw(), y.numel(), t, c.compute());
    }
  }

  void backward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& dy, Tensor& dx, Tensor& dw,
                Tensor& db, bool accumulate, KernelState&) override {
    const char* what = "conv2d backward";
    const DType t = act_type(x, s_.dtype, what, "x");
    expect_cuda(dy, t, what, "dy");
    CudaContext& c = sh_->ctx(x);
    ConvPlan& p = plan(x, t, c);
    const void* g = dy.raw();
    if (s_.fuse_relu) {  // dy masked by the forward output, into cached scratch
      expect_cuda(y, t, what, "y");
      void* m = masked_.get(dy.nbytes(), dy.device());
      relu_backward(m, dy.raw(), y.raw(), dy.numel(), t, c.compute());
      g = m;
    }
    float one = 1.0f, zero = 0.0f;
    double oned = 1.0, zerod = 0.0;
    bool dbl = s_.dtype == DType::f64;
    const void* a1 = dbl ? static_cast<const void*>(&oned) : &one;
    const void* a0 = dbl ? static_cast<const void*>(&zerod) : &zero;
    const void* bacc = accumulate ? a1 : a0;
    if (dw.defined()) {
      expect_cuda(dw, s_.dtype, what, "dw");
      if (t == s_.dtype) {
        RT_CUDNN(cudnnConvolutionBackwardFilter(c.cudnn(), a1, p.x.d, x.raw(), p.y.d, g, p.conv, p.bwd_filter,
                                                c.workspace(p.ws_filter), p.ws_filter, bacc, p.w, dw.raw()));
      } else {  // 16-bit data: the filter gradient in t, then into the float32 gradient
        const auto n = static_cast<std::size_t>(dw.numel());
        void* w16 = dw16_.get(n * dtype_size(t), dw.device());
        RT_CUDNN(cudnnConvolutionBackwardFilter(c.cudnn(), a1, p.x.d, x.raw(), p.y.d, g, p.conv, p.bwd_filter,
                                                c.workspace(p.ws_filter), p.ws_filter, a0, p.w, w16));
        if (!accumulate) {
          cast(dw.raw(), s_.dtype, w16, t, n, c.compute());
        } else {
          void* w32 = dw32_.get(n * dtype_size(s_.dtype), dw.device());
          cast(w32, s_.dtype, w16, t, n, c.compute());
          axpby(dw.raw(), dw.raw(), w32, 1.0f, 1.0f, n, s_.dtype, c.compute());
        }
      }
    }
    if (db.defined()) {  // summed in float from dy of type t
      expect_cuda(db, s_.dtype, what, "db");
      bias_grad(db.raw(), g, dy.dim(0), dy.dim(1), dy.dim(2) * dy.dim(3), accumulate, t, s_.dtype, c.compute());
    }
    if (dx.defined()) {
      expect_weight(w, t, what);
      expect_cuda(dx, t, what, "dx");
      RT_CUDNN(cudnnConvolutionBackwardData(c.cudnn(), a1, p.w, w.raw(), p.y.d, g, p.conv, p.bwd_data,
                                            c.workspace(p.ws_data), p.ws_data, a0, p.x.d, dx.raw()));
    }
  }

 private:
  void expect_weight(const Tensor& w, DType t, const char* what) const {
    RT_CHECK(!w.defined() || w.dtype() == t, what, ": the weight is ", dtype_name(w.dtype()), " but the input ",
             dtype_name(t), " (16-bit activations take a weight copy of their type)");
    expect_cuda(w, t, what, "w");
  }

  // One plan per input shape and data type t (s_.dtype, or 16-bit activations of a float32 kernel).
  ConvPlan& plan(const Tensor& x, DType t, CudaContext& c) {
    RT_CHECK(x.ndim() == 4 && x.dim(1) == s_.in_channels, "conv2d: input ", shape_str(x.shape()),
             " is not [N, ", s_.in_channels, ", H, W]");
    const auto shape = shape4(x);
    const std::array<std::int64_t, 5> key{shape[0], shape[1], shape[2], shape[3], static_cast<std::int64_t>(t)};
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;
    auto p = std::make_unique<ConvPlan>();
    const char* what = "conv2d";
    cudnnDataType_t dt = cudnn_type(t, what);
    p->x.set4(t, key[0], key[1], key[2], key[3], what);
    RT_CUDNN(cudnnCreateFilterDescriptor(&p->w));
    RT_CUDNN(cudnnSetFilter4dDescriptor(p->w, dt, CUDNN_TENSOR_NCHW, (int)s_.out_channels, (int)s_.in_channels,
                                        (int)s_.kernel_h, (int)s_.kernel_w));
    RT_CUDNN(cudnnCreateConvolutionDescriptor(&p->conv));
    cudnnDataType_t compute = s_.dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    RT_CUDNN(cudnnSetConvolution2dDescriptor(p->conv, (int)s_.pad_h, (int)s_.pad_w, (int)s_.stride_h,
                                             (int)s_.stride_w, (int)s_.dilation_h, (int)s_.dilation_w,
                                             CUDNN_CROSS_CORRELATION, compute));
    // f32 follows the spec's MathMode: strict FMA; tf32/bf16 -> TF32 tensor
    // cores (cuDNN has no f32->bf16 conversion; TF32 is at least as accurate);
    // fp16 -> tensor cores with f32->f16 conversion allowed.
    cudnnMathType_t math = CUDNN_FMA_MATH;
    if (t == DType::f16 || t == DType::bf16) math = CUDNN_TENSOR_OP_MATH;
    else if (s_.dtype == DType::f32 && s_.math == MathMode::fp16) math = CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    else if (s_.dtype == DType::f32 && s_.math != MathMode::fp32) math = CUDNN_DEFAULT_MATH;
    RT_CUDNN(cudnnSetConvolutionMathType(p->conv, math));
    int n, co, oh, ow;
    RT_CUDNN(cudnnGetConvolution2dForwardOutputDim(p->conv, p->x.d, p->w, &n, &co, &oh, &ow));
    p->y.set4(t, n, co, oh, ow, what);
    std::size_t lim = sh_->opt.conv_workspace_limit;
    cudnnHandle_t h = c.cudnn();
    // Heuristics or timed trials (cudnnFind*, BackendOptions::cudnn_find): both
    // return candidates best first; pick() takes the first within the limit.
    const bool find = sh_->opt.cudnn_find, det = sh_->opt.cudnn_deterministic;
    if (find) c.sync_compute();  // trials run on the handle's stream: time them alone
    auto f = pick<cudnnConvolutionFwdAlgoPerf_t>(
        [&](int m, int* k, cudnnConvolutionFwdAlgoPerf_t* r) {
          return find ? cudnnFindConvolutionForwardAlgorithm(h, p->x.d, p->w, p->conv, p->y.d, m, k, r)
                      : cudnnGetConvolutionForwardAlgorithm_v7(h, p->x.d, p->w, p->conv, p->y.d, m, k, r);
        },
        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, lim, det, "conv2d forward");
    auto d = pick<cudnnConvolutionBwdDataAlgoPerf_t>(
        [&](int m, int* k, cudnnConvolutionBwdDataAlgoPerf_t* r) {
          return find ? cudnnFindConvolutionBackwardDataAlgorithm(h, p->w, p->y.d, p->conv, p->x.d, m, k, r)
                      : cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p->w, p->y.d, p->conv, p->x.d, m, k, r);
        },
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, lim, det, "conv2d backward data");
    auto w = pick<cudnnConvolutionBwdFilterAlgoPerf_t>(
        [&](int m, int* k, cudnnConvolutionBwdFilterAlgoPerf_t* r) {
          return find ? cudnnFindConvolutionBackwardFilterAlgorithm(h, p->x.d, p->y.d, p->conv, p->w, m, k, r)
                      : cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p->x.d, p->y.d, p->conv, p->w, m, k, r);
        },
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, lim, det, "conv2d backward filter");
    p->fwd = f.algo;
    p->ws_fwd = f.memory;
    p->bwd_data = d.algo;
    p->ws_data = d.memory;
    p->bwd_filter = w.algo;
    p->ws_filter = w.memory;
    auto& ref = *p;
    plans_.emplace(key, std::move(p));
    return ref;
  }

  SharedPtr sh_;
  Conv2dSpec s_;
  std::map<std::array<std::int64_t, 5>, std::unique_ptr<ConvPlan>> plans_;
  Scratch masked_, dw16_, dw32_;  // dw16_/dw32_: the 16-bit weight gradient and its float32 cast
};

}  // namespace

std::unique_ptr<Conv2dKernel> make_conv2d(SharedPtr sh, const Conv2dSpec& s) {
  return std::make_unique<CudnnConv>(std::move(sh), s);
}

}  // namespace ringtrain::cuda::nnimpl
