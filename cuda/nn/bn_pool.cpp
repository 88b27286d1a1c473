// Batch norm (spatial) and 2-D pooling on cuDNN. Batch-norm parameters and
// statistics are float32 (cuDNN's derived parameter type for f32/f16/bf16 data).
// cuDNN updates the running variance with the unbiased batch variance, as
// PyTorch does; its exponentialAverageFactor is PyTorch's momentum.
// 16-bit activation storage (Backend::bf16_images): float32 kernels also take
// bf16 or f16 data (x, y, dy, dx); batch-norm parameters, their gradients and
// the statistics stay float32 (the derived descriptor's type), and cuDNN
// normalises and pools in float32 arithmetic.
#include <map>

#include "nn/common.hpp"

namespace ringtrain::cuda::nnimpl {
namespace {

class CudnnBatchNorm final : public BatchNormKernel {
 public:
  CudnnBatchNorm(SharedPtr sh, const BatchNormSpec& s) : sh_(std::move(sh)), s_(s) {
    RT_CHECK(s.channels > 0, "batchnorm: channels must be positive");
    RT_CHECK(s.eps >= CUDNN_BN_MIN_EPSILON, "batchnorm: eps ", s.eps, " is below cuDNN's minimum ",
             CUDNN_BN_MIN_EPSILON);
    cudnn_type(s.dtype, "batchnorm");
  }

  void forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean, Tensor& running_var,
               bool train, Tensor& y, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "cuda BatchNorm2d");
    Tensor& saved_ = sv.saved;
    bool& train_ = sv.train;
    const char* what = "batchnorm forward";
    const DType t = act_type(x, s_.dtype, what, "x");
    expect_cuda(y, t, what, "y");
    DType pt = param_type();
    expect_cuda(gamma, pt, what, "gamma");
    expect_cuda(beta, pt, what, "beta");
    expect_cuda(running_mean, pt, what, "running_mean");
    expect_cuda(running_var, pt, what, "running_var");
    CudaContext& c = sh_->ctx(x);
    set_shape(x, t);
    float one = 1.0f, zero = 0.0f;
    train_ = train;
    if (train) {
      std::size_t cb = static_cast<std::size_t>(s_.channels) * dtype_size(pt);
      char* save = static_cast<char*>(kept_buffer(saved_, 2 * cb, x.device()));
      RT_CUDNN(cudnnBatchNormalizationForwardTraining(
          c.cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd_.d, x.raw(), xd_.d, y.raw(), pd_.d, gamma.raw(),
          beta.raw(), s_.momentum, running_mean.raw(), running_var.raw(), s_.eps, save, save + cb));
    } else {
      RT_CUDNN(cudnnBatchNormalizationForwardInference(c.cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd_.d,
                                                       x.raw(), xd_.d, y.raw(), pd_.d, gamma.raw(), beta.raw(),
                                                       running_mean.raw(), running_var.raw(), s_.eps));
    }
  }

  void backward(const Tensor& x, const Tensor& gamma, const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                bool accumulate, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "cuda BatchNorm2d");
    Tensor& saved_ = sv.saved;
    const bool train_ = sv.train;
    const char* what = "batchnorm backward";
    RT_CHECK(train_, what, ": after an eval-mode forward is not implemented on CUDA (train-mode only)");
    const DType t = act_type(x, s_.dtype, what, "x");
    expect_cuda(dy, t, what, "dy");
    expect_cuda(dx, t, what, "dx");
    DType pt = param_type();
    expect_cuda(dgamma, pt, what, "dgamma");
    expect_cuda(dbeta, pt, what, "dbeta");
    CudaContext& c = sh_->ctx(x);
    set_shape(x, t);
    float one = 1.0f, zero = 0.0f;
    std::size_t cb = static_cast<std::size_t>(s_.channels) * dtype_size(pt);
    char* save = static_cast<char*>(kept_for_backward(saved_, 2 * cb, "cuda BatchNorm2d"));
    RT_CUDNN(cudnnBatchNormalizationBackward(c.cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one,
                                             accumulate ? &one : &zero, xd_.d, x.raw(), xd_.d, dy.raw(), xd_.d,
                                             dx.raw(), pd_.d, gamma.raw(), dgamma.raw(), dbeta.raw(), s_.eps, save,
                                             save + cb));
  }

 private:
  DType param_type() const { return s_.dtype == DType::f64 ? DType::f64 : DType::f32; }
  // Descriptors for x's shape and data type t (the derived parameter descriptor stays float32).
  void set_shape(const Tensor& x, DType t) {
    RT_CHECK(x.ndim() == 4 && x.dim(1) == s_.channels, "batchnorm: input ", shape_str(x.shape()), " is not [N, ",
             s_.channels, ", H, W]");
    auto k = shape4(x);
    if (k == shape_ && t == type_) return;
    xd_.set4(t, k[0], k[1], k[2], k[3], "batchnorm");
    RT_CUDNN(cudnnDeriveBNTensorDescriptor(pd_.d, xd_.d, CUDNN_BATCHNORM_SPATIAL));
    shape_ = k;
    type_ = t;
  }

  SharedPtr sh_;
  BatchNormSpec s_;
  TensorDesc xd_, pd_;
  std::array<std::int64_t, 4> shape_{};
  DType type_ = DType::f32;
  // Forward to backward: the batch's mean and inverse std (training forward).
  struct Saved final : KernelState {
    Tensor saved;
    bool train = true;
  };

 public:
  KernelStatePtr make_state() const override { return std::make_unique<Saved>(); }
};

class CudnnPool final : public Pool2dKernel {
 public:
  CudnnPool(SharedPtr sh, const Pool2dSpec& s) : sh_(std::move(sh)), s_(s) {
    RT_CUDNN(cudnnCreatePoolingDescriptor(&pd_));
    // Max: deterministic backward (ties routed to one input, like PyTorch's index);
    // avg: padding counted (PyTorch's count_include_pad=True).
    cudnnPoolingMode_t mode =
        s.kind == PoolKind::max ? CUDNN_POOLING_MAX_DETERMINISTIC : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
    RT_CUDNN(cudnnSetPooling2dDescriptor(pd_, mode, CUDNN_PROPAGATE_NAN, (int)s.kernel_h, (int)s.kernel_w,
                                         (int)s.pad_h, (int)s.pad_w, (int)s.stride_h, (int)s.stride_w));
    cudnn_type(s.dtype, "pool2d");
  }
  ~CudnnPool() override { cudnnDestroyPoolingDescriptor(pd_); }

  void forward(const Tensor& x, Tensor& y, bool, KernelState&) override {
    const DType t = act_type(x, s_.dtype, "pool2d forward", "x");
    expect_cuda(y, t, "pool2d forward", "y");
    CudaContext& c = sh_->ctx(x);
    set_shape(x, y, t);
    float one = 1.0f, zero = 0.0f;
    RT_CUDNN(cudnnPoolingForward(c.cudnn(), pd_, &one, xd_.d, x.raw(), &zero, yd_.d, y.raw()));
  }

  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx, KernelState&) override {
    const DType t = act_type(x, s_.dtype, "pool2d backward", "x");
    expect_cuda(y, t, "pool2d backward", "y");
    expect_cuda(dy, t, "pool2d backward", "dy");
    expect_cuda(dx, t, "pool2d backward", "dx");
    CudaContext& c = sh_->ctx(x);
    set_shape(x, y, t);
    float one = 1.0f, zero = 0.0f;
    RT_CUDNN(cudnnPoolingBackward(c.cudnn(), pd_, &one, yd_.d, y.raw(), yd_.d, dy.raw(), xd_.d, x.raw(), &zero,
                                  xd_.d, dx.raw()));
  }

 private:
  void set_shape(const Tensor& x, const Tensor& y, DType t) {
    RT_CHECK(x.ndim() == 4 && y.ndim() == 4, "pool2d: x ", shape_str(x.shape()), " and y ", shape_str(y.shape()),
             " must be 4-D");
    auto k = shape4(x);
    if (k == shape_ && t == type_) return;
    xd_.set4(t, k[0], k[1], k[2], k[3], "pool2d");
    int n, ch, h, w;
    RT_CUDNN(cudnnGetPooling2dForwardOutputDim(pd_, xd_.d, &n, &ch, &h, &w));
    RT_CHECK(y.dim(0) == n && y.dim(1) == ch && y.dim(2) == h && y.dim(3) == w, "pool2d: output ",
             shape_str(y.shape()), " does not match [", n, ", ", ch, ", ", h, ", ", w, "]");
    yd_.set4(t, n, ch, h, w, "pool2d");
    shape_ = k;
    type_ = t;
  }

  SharedPtr sh_;
  Pool2dSpec s_;
  cudnnPoolingDescriptor_t pd_ = nullptr;
  TensorDesc xd_, yd_;
  std::array<std::int64_t, 4> shape_{};
  DType type_ = DType::f32;
};

}  // namespace

std::unique_ptr<BatchNormKernel> make_batchnorm(SharedPtr sh, const BatchNormSpec& s) {
  return std::make_unique<CudnnBatchNorm>(std::move(sh), s);
}
std::unique_ptr<Pool2dKernel> make_pool2d(SharedPtr sh, const Pool2dSpec& s) {
  return std::make_unique<CudnnPool>(std::move(sh), s);
}

}  // namespace ringtrain::cuda::nnimpl
