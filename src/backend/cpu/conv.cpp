// Conv2d on oneDNN: forward (ReLU fused as a post-op), backward data and
// backward weights (+bias). The primitives choose their memory formats
// ("any"): on AVX2/AVX-512 that is nChw8c/16c with blocked weights; the
// reorders to and from the caller's plain NCHW are built once per input shape.
// The forward's reordered input is reused by backward-weights, and a reordered
// output gradient is shared by backward-data and backward-weights.
#include <map>

#include "cpu_backend.hpp"

namespace ringtrain::cpu {
namespace {

using namespace dnnl;

class CpuConv2d final : public Conv2dKernel {
 public:
  CpuConv2d(const Conv2dSpec& s, DnnlPtr d) : s_(s), d_(std::move(d)) {
    RT_CHECK(s.dtype == DType::f32, "cpu Conv2d: only float32 is supported, got ", dtype_name(s.dtype));
  }

  void forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) override {
    Plan& p = plan(x.shape());
    auto& st = d_->strm;
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, p.src.in(x.raw(), st)},
                                         {DNNL_ARG_WEIGHTS, p.wei.in(w.raw(), st)},
                                         {DNNL_ARG_DST, p.dst.out(y.raw())},
                                         {DNNL_ARG_SCRATCHPAD, p.scratch_f}};
    if (s_.bias) args.emplace(DNNL_ARG_BIAS, p.bia.in(b.raw(), st));
    p.fwd.execute(st, args);
    p.dst.finish(st, false);
    p.src_valid = true;
  }

  void backward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& dy, Tensor& dx, Tensor& dw,
                Tensor& db, bool accumulate) override {
    Plan& p = plan(x.shape());
    auto& st = d_->strm;
    const void* g = dy.raw();
    if (s_.fuse_relu) {
      relu_mask(y.data<float>(), dy.data<float>(), p.masked.data<float>(), dy.numel());
      g = p.masked.raw();
    }
    memory& gd = p.ddst.in(g, st);  // shared by both backward primitives
    if (dx.defined()) {
      p.bwd_data.execute(st, {{DNNL_ARG_DIFF_DST, p.ddst_bd_shared ? gd : p.ddst_bd.in(g, st)},
                              {DNNL_ARG_WEIGHTS, p.wei_bd.in(w.raw(), st)},
                              {DNNL_ARG_DIFF_SRC, p.dsrc.out(dx.raw())},
                              {DNNL_ARG_SCRATCHPAD, p.scratch_bd}});
      p.dsrc.finish(st, false);
    }
    // The forward's reordered input is still there unless another forward ran.
    memory& xs = (p.src_bw_shared && p.src_valid) ? p.src.inner() : p.src_bw.in(x.raw(), st);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, xs},
                                         {DNNL_ARG_DIFF_DST, gd},
                                         {DNNL_ARG_DIFF_WEIGHTS, p.dwei.out(dw.raw())},
                                         {DNNL_ARG_SCRATCHPAD, p.scratch_bw}};
    if (s_.bias) args.emplace(DNNL_ARG_DIFF_BIAS, p.dbia.out(db.raw()));
    p.bwd_w.execute(st, args);
    p.dwei.finish(st, accumulate);
    if (s_.bias) p.dbia.finish(st, accumulate);
    st.wait();
  }

 private:
  struct Plan {
    convolution_forward fwd;
    convolution_backward_data bwd_data;
    convolution_backward_weights bwd_w;
    Arg src, wei, bia, dst;             // forward
    Arg ddst, ddst_bd, wei_bd, dsrc;    // backward data (ddst in bwd-weights' format)
    Arg src_bw, dwei, dbia;             // backward weights
    bool ddst_bd_shared = false, src_bw_shared = false, src_valid = false;
    memory scratch_f, scratch_bd, scratch_bw;
    Tensor masked;  // ReLU-masked output gradient (plain)
  };

  Plan& plan(const Shape& xs) {
    auto it = plans_.find(xs);
    if (it != plans_.end()) return it->second;
    const auto& s = s_;
    const memory::dim oh = (xs[2] + 2 * s.pad_h - s.dilation_h * (s.kernel_h - 1) - 1) / s.stride_h + 1;
    const memory::dim ow = (xs[3] + 2 * s.pad_w - s.dilation_w * (s.kernel_w - 1) - 1) / s.stride_w + 1;
    memory::dims src_d = dims4(xs), wei_d{s.out_channels, s.in_channels, s.kernel_h, s.kernel_w},
                 bia_d{s.out_channels}, dst_d{xs[0], s.out_channels, oh, ow}, strides{s.stride_h, s.stride_w},
                 dil{s.dilation_h - 1, s.dilation_w - 1}, pad{s.pad_h, s.pad_w};
    auto any = [](const memory::dims& d) { return memory::desc(d, dt::f32, tag::any); };
    auto src_p = plain_md(src_d, tag::nchw), wei_p = plain_md(wei_d, tag::oihw), bia_p = plain_md(bia_d, tag::x),
         dst_p = plain_md(dst_d, tag::nchw);
    auto& eng = d_->eng;
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    if (s.fuse_relu) {
      post_ops po;
      po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
      attr.set_post_ops(po);
    }
    auto fd = s.bias ? convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                                 any(src_d), any(wei_d), bia_p, any(dst_d), strides, dil, pad, pad)
                     : convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                                 any(src_d), any(wei_d), any(dst_d), strides, dil, pad, pad);
    convolution_forward::primitive_desc fpd(fd, attr, eng);
    primitive_attr battr;
    battr.set_scratchpad_mode(scratchpad_mode::user);
    convolution_backward_data::primitive_desc bdpd(
        convolution_backward_data::desc(algorithm::convolution_direct, any(src_d), any(wei_d), any(dst_d), strides,
                                        dil, pad, pad),
        battr, eng, fpd);
    auto bwd = s.bias ? convolution_backward_weights::desc(algorithm::convolution_direct, any(src_d), any(wei_d),
                                                           bia_p, any(dst_d), strides, dil, pad, pad)
                      : convolution_backward_weights::desc(algorithm::convolution_direct, any(src_d), any(wei_d),
                                                           any(dst_d), strides, dil, pad, pad);
    convolution_backward_weights::primitive_desc bwpd(bwd, battr, eng, fpd);

    Plan p;
    p.fwd = convolution_forward(fpd);
    p.bwd_data = convolution_backward_data(bdpd);
    p.bwd_w = convolution_backward_weights(bwpd);
    p.src = Arg(src_p, fpd.src_desc(), eng, true);
    p.wei = Arg(wei_p, fpd.weights_desc(), eng, true);
    if (s.bias) p.bia = Arg(bia_p, fpd.bias_desc(), eng, true);
    p.dst = Arg(dst_p, fpd.dst_desc(), eng, false);
    p.ddst = Arg(dst_p, bwpd.diff_dst_desc(), eng, true);
    p.ddst_bd_shared = bdpd.diff_dst_desc() == bwpd.diff_dst_desc();
    if (!p.ddst_bd_shared) p.ddst_bd = Arg(dst_p, bdpd.diff_dst_desc(), eng, true);
    p.wei_bd = Arg(wei_p, bdpd.weights_desc(), eng, true);
    p.dsrc = Arg(src_p, bdpd.diff_src_desc(), eng, false);
    p.src_bw_shared = p.src.separate() && bwpd.src_desc() == fpd.src_desc();
    p.src_bw = Arg(src_p, bwpd.src_desc(), eng, true);
    // Weight gradients always land in a separate buffer so that accumulation
    // is a reorder with a sum post-op.
    p.dwei = Arg(wei_p, bwpd.diff_weights_desc(), eng, false, true);
    if (s.bias) p.dbia = Arg(bia_p, bwpd.diff_bias_desc(), eng, false, true);
    p.scratch_f = make_scratch(fpd, eng);
    p.scratch_bd = make_scratch(bdpd, eng);
    p.scratch_bw = make_scratch(bwpd, eng);
    if (s.fuse_relu) p.masked = Tensor::empty({xs[0], s.out_channels, oh, ow});
    return plans_.emplace(xs, std::move(p)).first->second;
  }

  Conv2dSpec s_;
  DnnlPtr d_;
  std::map<Shape, Plan> plans_;
};

}  // namespace

std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dSpec& s, DnnlPtr d) {
  return std::make_unique<CpuConv2d>(s, std::move(d));
}

}  // namespace ringtrain::cpu
