// Pooling and eltwise (ReLU, GELU) on oneDNN, plain NCHW, primitives cached
// per input shape. Max pooling keeps oneDNN's workspace (argmax) from the
// training forward for its backward. Pooling takes float32 or bfloat16 data
// (train.precision = bf16 storage; oneDNN averages bf16 in float32 registers).
#include <map>

#include "cpu_backend.hpp"

namespace ringtrain::cpu {
namespace {

using namespace dnnl;

class CpuPool final : public Pool2dKernel {
 public:
  CpuPool(const Pool2dSpec& s, DnnlPtr d) : s_(s), d_(std::move(d)) {
    RT_CHECK(s.dtype == DType::f32, "cpu Pool2d: spec dtype must be float32, got ", dtype_name(s.dtype));
  }

  KernelStatePtr make_state() const override { return std::make_unique<Saved>(); }

  void forward(const Tensor& x, Tensor& y, bool train, KernelState& ks) override {
    Tensor& ws_ = state_as<Saved>(ks, "cpu Pool2d").ws;
    const dt t = dnnl_type(x, "Pool2d input");
    RT_CHECK(dnnl_type(y, "Pool2d output") == t, "cpu Pool2d: output dtype differs from the input's");
    Plan& p = plan(x.shape(), y.shape(), t);
    p.src.set_data_handle(x.raw());
    p.dst.set_data_handle(y.raw());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, p.src}, {DNNL_ARG_DST, p.dst}};
    if (p.ws && train) {
      p.ws.set_data_handle(kept(ws_, p.ws.get_desc().get_size()));
      args.emplace(DNNL_ARG_WORKSPACE, p.ws);
    }
    (train ? p.fwd : p.fwd_eval).execute(d_->strm, args);
    d_->strm.wait();
  }

  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx, KernelState& ks) override {
    Tensor& ws_ = state_as<Saved>(ks, "cpu Pool2d").ws;
    const dt t = dnnl_type(x, "Pool2d input");
    RT_CHECK(dnnl_type(dy, "Pool2d gradient") == t && dnnl_type(dx, "Pool2d dx") == t,
             "cpu Pool2d: gradient dtypes differ from the input's");
    Plan& p = plan(x.shape(), y.shape(), t);
    p.ddst.set_data_handle(dy.raw());
    p.dsrc.set_data_handle(dx.raw());
    std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, p.ddst}, {DNNL_ARG_DIFF_SRC, p.dsrc}};
    if (p.ws) {
      p.ws.set_data_handle(kept_for_backward(ws_, p.ws.get_desc().get_size(), "cpu Pool2d"));
      args.emplace(DNNL_ARG_WORKSPACE, p.ws);
    }
    p.bwd.execute(d_->strm, args);
    d_->strm.wait();
  }

 private:
  struct Plan {
    pooling_v2_forward fwd, fwd_eval;
    pooling_v2_backward bwd;
    memory src, dst, ddst, dsrc, ws;
  };

  Plan& plan(const Shape& xs, const Shape& ys, dt t) {
    const auto key = std::make_pair(xs, int(t));
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    auto& eng = d_->eng;
    auto smd = plain_md(dims4(xs), tag::nchw, t), dmd = plain_md(dims4(ys), tag::nchw, t);
    const algorithm alg = s_.kind == PoolKind::max ? algorithm::pooling_max : algorithm::pooling_avg_include_padding;
    memory::dims k{s_.kernel_h, s_.kernel_w}, st{s_.stride_h, s_.stride_w}, dil{0, 0}, pl{s_.pad_h, s_.pad_w};
    // Right padding so that oneDNN's output size equals the floor formula.
    memory::dims pr{(ys[2] - 1) * s_.stride_h + s_.kernel_h - xs[2] - s_.pad_h,
                    (ys[3] - 1) * s_.stride_w + s_.kernel_w - xs[3] - s_.pad_w};
    pooling_v2_forward::primitive_desc fpd({prop_kind::forward_training, alg, smd, dmd, st, k, dil, pl, pr}, eng);
    pooling_v2_forward::primitive_desc epd({prop_kind::forward_inference, alg, smd, dmd, st, k, dil, pl, pr}, eng);
    pooling_v2_backward::primitive_desc bpd({alg, smd, dmd, st, k, dil, pl, pr}, eng, fpd);
    Plan p;
    p.fwd = pooling_v2_forward(fpd);
    p.fwd_eval = pooling_v2_forward(epd);
    p.bwd = pooling_v2_backward(bpd);
    p.src = memory(smd, eng, DNNL_MEMORY_NONE);
    p.dst = memory(dmd, eng, DNNL_MEMORY_NONE);
    p.ddst = memory(dmd, eng, DNNL_MEMORY_NONE);
    p.dsrc = memory(smd, eng, DNNL_MEMORY_NONE);
    if (fpd.workspace_desc().get_size() > 0) p.ws = memory(fpd.workspace_desc(), eng, DNNL_MEMORY_NONE);
    return plans_.emplace(key, std::move(p)).first->second;
  }

  Pool2dSpec s_;
  DnnlPtr d_;
  struct Saved final : KernelState {
    Tensor ws;  // forward to backward: max pooling's argmax workspace (bound to the plan's ws)
  };
  std::map<std::pair<Shape, int>, Plan> plans_;  // per input shape and data type
};

class CpuEltwise final : public EltwiseKernel {
 public:
  CpuEltwise(Eltwise op, DnnlPtr d) : op_(op), d_(std::move(d)) {}

  // float32 or bfloat16 activations (oneDNN computes bf16 in float32 registers).
  void forward(const Tensor& x, Tensor& y) override {
    const dt t = dnnl_type(x, "eltwise input");
    RT_CHECK(dnnl_type(y, "eltwise output") == t, "eltwise: output type differs from the input's");
    Plan& p = plan(x.numel(), t);
    p.a.set_data_handle(x.raw());
    p.b.set_data_handle(y.raw());
    p.fwd.execute(d_->strm, {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_DST, p.b}});
    d_->strm.wait();
  }

  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override {
    const dt t = dnnl_type(dy, "eltwise gradient");
    RT_CHECK(dnnl_type(dx, "eltwise input gradient") == t && x.dtype() == dy.dtype(),
             "eltwise backward: x, dy and dx must have one type");
    if (op_ == Eltwise::relu && t == dt::f32) {  // cheaper from the output, and exact
      relu_mask(y.data<float>(), dy.data<float>(), dx.data<float>(), dy.numel());
      return;
    }
    if (op_ == Eltwise::relu) {  // bfloat16: keep where y > 0 (vectorised; the short-circuit loop was 30x the forward)
      relu_mask(y.data<bfloat16>(), dy.data<bfloat16>(), dx.data<bfloat16>(), dy.numel());
      return;
    }
    Plan& p = plan(x.numel(), t);
    p.a.set_data_handle(x.raw());
    p.b.set_data_handle(dy.raw());
    p.c.set_data_handle(dx.raw());
    p.bwd.execute(d_->strm, {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_DIFF_DST, p.b}, {DNNL_ARG_DIFF_SRC, p.c}});
    d_->strm.wait();
  }

 private:
  struct Plan {
    eltwise_forward fwd;
    eltwise_backward bwd;
    memory a, b, c;
  };

  // Eltwise ops are shape-agnostic: plan by element count and type on a 1-D view.
  Plan& plan(std::int64_t n, dt t) {
    auto it = plans_.find({n, int(t)});
    if (it != plans_.end()) return it->second;
    auto& eng = d_->eng;
    auto md = plain_md({n}, tag::x, t);
    const algorithm alg = op_ == Eltwise::relu   ? algorithm::eltwise_relu
                          : op_ == Eltwise::gelu ? algorithm::eltwise_gelu_erf
                                                 : algorithm::eltwise_gelu_tanh;
    eltwise_forward::primitive_desc fpd({prop_kind::forward_training, alg, md, 0.f, 0.f}, eng);
    eltwise_backward::primitive_desc bpd({alg, md, md, 0.f, 0.f}, eng, fpd);
    Plan p{eltwise_forward(fpd), eltwise_backward(bpd), memory(md, eng, DNNL_MEMORY_NONE),
           memory(md, eng, DNNL_MEMORY_NONE), memory(md, eng, DNNL_MEMORY_NONE)};
    return plans_.emplace(std::make_pair(n, int(t)), std::move(p)).first->second;
  }

  Eltwise op_;
  DnnlPtr d_;
  std::map<std::pair<std::int64_t, int>, Plan> plans_;
};

}  // namespace

std::unique_ptr<Pool2dKernel> make_pool2d(const Pool2dSpec& s, DnnlPtr d) {
  return std::make_unique<CpuPool>(s, std::move(d));
}
std::unique_ptr<EltwiseKernel> make_eltwise(Eltwise op, DnnlPtr d) {
  return std::make_unique<CpuEltwise>(op, std::move(d));
}

}  // namespace ringtrain::cpu
