// Conv2d on oneDNN: forward (ReLU fused as a post-op, pooling optionally fused
// after it), backward data and backward weights (+bias).
//
// The primitives choose their memory formats ("any"): on AVX2/AVX-512 that is
// nChw8c/16c with blocked weights. Reorders to and from the caller's plain
// NCHW are created once per input shape and cached with the primitives. With
// fused pooling, the large pre-pool activation stays in the blocked format
// (pooling, its backward and the ReLU mask run there) and only the pooled
// tensor is reordered. The forward's reordered input is reused by
// backward-weights, and one reordered output gradient feeds both backward
// primitives when their formats agree.
// Activations (x, y, dx, dy) are float32, or bfloat16 with a bfloat16 weight
// copy (train.precision = bf16 storage): the products then read and write
// bf16 and accumulate in float32; bias, weight and bias gradients stay float32.
#include <algorithm>
#include <cstring>
#include <map>

#include "cpu_backend.hpp"
#include "simd.hpp"

namespace ringtrain::cpu {
namespace {

using namespace dnnl;

// A cached reorder between two oneDNN memories (no-op when formats agree).
struct Convert {
  memory dst;
  reorder r;
  bool needed = false;
  Convert() = default;
  Convert(const memory& src, const memory::desc& want, const engine& eng) {
    needed = src.get_desc() != want;
    if (needed) {
      dst = memory(want, eng);
      r = reorder(src, dst);
    }
  }
  memory& operator()(memory& src, stream& s) {
    if (!needed) return src;
    r.execute(s, src, dst);
    return dst;
  }
};

// Strides of an [N, C, H, W] activation in a plain or channel-blocked oneDNN
// layout (nchw, nhwc, nChw8c, nChw16c): offset = n sn + (c / B) sc + h sh + w sw + c % B.
struct Layout {
  memory::dim sn = 0, sc = 0, sh = 0, sw = 0, block = 1;
  static bool of(const memory::desc& md, Layout& L) {
    const auto& d = md.data;
    if (d.format_kind != dnnl_blocked || d.ndims != 4) return false;
    const auto& b = d.format_desc.blocking;
    if (b.inner_nblks > 1 || (b.inner_nblks == 1 && b.inner_idxs[0] != 1)) return false;
    L = {b.strides[0], b.strides[1], b.strides[2], b.strides[3], b.inner_nblks ? b.inner_blks[0] : 1};
    return true;
  }
  bool operator==(const Layout&) const = default;
};

// Max-pooling backward from the forward's input and output, in a channel-
// blocked layout (B = 8 or 16 lanes): each output's gradient goes to the first
// window element equal to the output (the argmax oneDNN and PyTorch pick).
// Branch-free over the lanes so it vectorises. Replaces oneDNN's
// workspace-based backward, whose forward-training kernel costs ~3x the
// inference one.
// The common 2x2, stride 2, unpadded case: windows tile the input, so every
// covered element is written once (no zero fill, no read-modify-write).
// Lanes go 8 at a time: AVX2 compare/and masks where the CPU has them
// (simd.x86_64.cpp; oneDNN itself needs AVX2 for its fast paths), portable code otherwise.
struct Lanes8 {
  static void portable(const float* p00, const float* p01, const float* p10, const float* y, const float* g,
                       float* q00, float* q01, float* q10, float* q11) {
    for (int l = 0; l < 8; ++l) {
      const bool e00 = p00[l] == y[l], e01 = !e00 && p01[l] == y[l], e10 = !e00 && !e01 && p10[l] == y[l];
      q00[l] = e00 ? g[l] : 0.f;
      q01[l] = e01 ? g[l] : 0.f;
      q10[l] = e10 ? g[l] : 0.f;
      q11[l] = (e00 || e01 || e10) ? 0.f : g[l];  // the maximum is somewhere in the window
    }
  }
};

template <int B>
void maxpool2x2_backward(const float* act, const float* y, const float* dy, float* gact, std::size_t act_bytes,
                         const Layout& La, const Layout& Ly, const memory::dims& ad, const memory::dims& yd) {
  static_assert(B % 8 == 0);
  if (ad[2] != 2 * yd[2] || ad[3] != 2 * yd[3]) std::memset(gact, 0, act_bytes);  // odd sizes: uncovered edge
  const CpuSimd* simd = cpu_simd();
  const auto lanes = simd ? simd->maxpool_lanes8 : &Lanes8::portable;
  const memory::dim cblocks = (ad[1] + B - 1) / B;
#pragma omp parallel for collapse(2) schedule(static)
  for (memory::dim n = 0; n < ad[0]; ++n)
    for (memory::dim cb = 0; cb < cblocks; ++cb)
      for (memory::dim oh = 0; oh < yd[2]; ++oh) {
        const memory::dim a0 = n * La.sn + cb * La.sc + 2 * oh * La.sh, a1 = a0 + La.sh;
        const memory::dim y0 = n * Ly.sn + cb * Ly.sc + oh * Ly.sh;
        for (memory::dim ow = 0; ow < yd[3]; ++ow) {
          const memory::dim yo = y0 + ow * Ly.sw;
          const memory::dim i00 = a0 + 2 * ow * La.sw, i01 = i00 + La.sw, i10 = a1 + 2 * ow * La.sw, i11 = i10 + La.sw;
          for (int l = 0; l < B; l += 8)
            lanes(act + i00 + l, act + i01 + l, act + i10 + l, y + yo + l, dy + yo + l, gact + i00 + l,
                  gact + i01 + l, gact + i10 + l, gact + i11 + l);
        }
      }
}

template <int B>
void maxpool_backward(const float* act, const float* y, const float* dy, float* gact, std::size_t act_bytes,
                      const Layout& La, const Layout& Ly, const memory::dims& ad, const memory::dims& yd,
                      const Pool2dSpec& q) {
  if (q.kernel_h == 2 && q.kernel_w == 2 && q.stride_h == 2 && q.stride_w == 2 && q.pad_h == 0 && q.pad_w == 0)
    return maxpool2x2_backward<B>(act, y, dy, gact, act_bytes, La, Ly, ad, yd);
  std::memset(gact, 0, act_bytes);
  const memory::dim cblocks = (ad[1] + B - 1) / B;
#pragma omp parallel for collapse(2) schedule(static)
  for (memory::dim n = 0; n < ad[0]; ++n)
    for (memory::dim cb = 0; cb < cblocks; ++cb)
      for (memory::dim oh = 0; oh < yd[2]; ++oh)
        for (memory::dim ow = 0; ow < yd[3]; ++ow) {
          const memory::dim yo = n * Ly.sn + cb * Ly.sc + oh * Ly.sh + ow * Ly.sw;
          float done[B] = {};
          for (memory::dim kh = 0; kh < q.kernel_h; ++kh) {
            const memory::dim ih = oh * q.stride_h - q.pad_h + kh;
            if (ih < 0 || ih >= ad[2]) continue;
            for (memory::dim kw = 0; kw < q.kernel_w; ++kw) {
              const memory::dim iw = ow * q.stride_w - q.pad_w + kw;
              if (iw < 0 || iw >= ad[3]) continue;
              const memory::dim ai = n * La.sn + cb * La.sc + ih * La.sh + iw * La.sw;
#pragma omp simd
              for (int l = 0; l < B; ++l) {
                const float hit = (done[l] == 0.f && act[ai + l] == y[yo + l]) ? 1.f : 0.f;
                gact[ai + l] += hit * dy[yo + l];
                done[l] += hit;
              }
            }
          }
        }
}

// ReLU backward from its output on float32 or bfloat16 storage: dst = y > 0 ? dy : 0.
void relu_mask_as(const void* y, const void* dy, void* dst, std::int64_t n, dt t) {
  if (t == dt::f32)
    return relu_mask(static_cast<const float*>(y), static_cast<const float*>(dy), static_cast<float*>(dst), n);
  relu_mask(static_cast<const bfloat16*>(y), static_cast<const bfloat16*>(dy), static_cast<bfloat16*>(dst), n);
}

class CpuConv2d final : public Conv2dKernel {
 public:
  CpuConv2d(const Conv2dSpec& s, DnnlPtr d) : s_(s), d_(std::move(d)) {
    RT_CHECK(s.dtype == DType::f32, "cpu Conv2d: parameters must be float32, got ", dtype_name(s.dtype));
  }

  KernelStatePtr make_state() const override { return std::make_unique<Saved>(); }

  void forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, KernelState& ks) override {
    const dt at = types(x, w, "forward");
    RT_CHECK(dnnl_type(y, "Conv2d output") == at, "cpu Conv2d: output dtype differs from the input's");
    Plan& p = plan(x.shape(), at);
    auto& st = d_->strm;
    bind_state(p, state_as<Saved>(ks, "cpu Conv2d"), false);
    memory& out = s_.fuse_pool ? p.act : p.dst.out(y.raw());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, p.src.in(x.raw(), st)},
                                         {DNNL_ARG_WEIGHTS, p.wei.in(w.raw(), st)},
                                         {DNNL_ARG_DST, out},
                                         {DNNL_ARG_SCRATCHPAD, p.scratch_f}};
    if (s_.bias) args.emplace(DNNL_ARG_BIAS, p.bia.in(b.raw(), st));
    p.fwd.execute(st, args);
    if (s_.fuse_pool) {
      std::unordered_map<int, memory> pargs{{DNNL_ARG_SRC, p.act}, {DNNL_ARG_DST, p.pdst.out(y.raw())}};
      if (p.ws) pargs.emplace(DNNL_ARG_WORKSPACE, p.ws);  // only on the oneDNN-backward path
      p.pfwd.execute(st, pargs);
      p.pdst.finish(st, false);
    } else {
      p.dst.finish(st, false);
    }
    st.wait();
  }

  void backward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& dy, Tensor& dx, Tensor& dw,
                Tensor& db, bool accumulate, KernelState& ks) override {
    const dt at = types(x, w, "backward");
    RT_CHECK(dnnl_type(dy, "Conv2d gradient") == at && (!dx.defined() || dnnl_type(dx, "Conv2d dx") == at),
             "cpu Conv2d: gradient dtypes differ from the input's");
    RT_CHECK(!dw.defined() || (dw.dtype() == DType::f32 && (!s_.bias || db.dtype() == DType::f32)),
             "cpu Conv2d: parameter gradients must be float32");
    Plan& p = plan(x.shape(), at);
    auto& st = d_->strm;
    bind_state(p, state_as<Saved>(ks, "cpu Conv2d"), true);
    if (p.src_bw_shared && !p.src.separate()) p.src.in(x.raw(), st);  // the plain input itself: no reorder
    if (p.own_maxpool_bwd && !p.pdst.separate()) p.pdst.out(const_cast<void*>(y.raw()));
    memory* g;  // output gradient of the convolution (after ReLU's mask)
    if (s_.fuse_pool) {
      // max(relu(z)) = relu(max(z)) with the same argmax wherever the gradient
      // is non-zero, so the ReLU mask can be applied on the 4x smaller pooled
      // gradient, before the pooling backward.
      const bool mask_pooled = s_.fuse_relu && s_.pool.kind == PoolKind::max;
      const void* gp = dy.raw();
      if (mask_pooled) {
        relu_mask_as(y.raw(), dy.raw(), p.masked.raw(), dy.numel(), at);
        gp = p.masked.raw();
      }
      memory& gpool = p.pddst.in(gp, st);
      if (p.own_maxpool_bwd) {
        st.wait();
        (p.act_layout.block == 8 ? maxpool_backward<8> : maxpool_backward<16>)(static_cast<const float*>(p.act.get_data_handle()),
                         static_cast<const float*>(p.pdst.inner().get_data_handle()),
                         static_cast<const float*>(gpool.get_data_handle()), static_cast<float*>(p.gact.get_data_handle()),
                         p.gact.get_desc().get_size(), p.act_layout, p.pool_layout, p.act.get_desc().dims(),
                         p.pddst.inner().get_desc().dims(), s_.pool);
      } else {
        std::unordered_map<int, memory> pargs{{DNNL_ARG_DIFF_DST, gpool}, {DNNL_ARG_DIFF_SRC, p.gact}};
        if (p.ws) pargs.emplace(DNNL_ARG_WORKSPACE, p.ws);
        p.pbwd.execute(st, pargs);
        st.wait();
      }
      if (s_.fuse_relu && !mask_pooled) {
        const auto n = static_cast<std::int64_t>(p.gact.get_desc().get_size() / (p.ot == dt::f32 ? 4 : 2));
        void* ga = p.gact.get_data_handle();
        relu_mask_as(p.act.get_data_handle(), ga, ga, n, p.ot);
      }
      g = &p.gact;
    } else {
      const void* gp = dy.raw();
      if (s_.fuse_relu) {
        relu_mask_as(y.raw(), dy.raw(), p.masked.raw(), dy.numel(), at);
        gp = p.masked.raw();
      }
      g = &p.gin.in(gp, st);
    }
    if (dx.defined()) {
      p.bwd_data.execute(st, {{DNNL_ARG_DIFF_DST, p.g_bd(*g, st)},
                              {DNNL_ARG_WEIGHTS, p.wei_bd.in(w.raw(), st)},
                              {DNNL_ARG_DIFF_SRC, p.dsrc.out(dx.raw())},
                              {DNNL_ARG_SCRATCHPAD, p.scratch_bd}});
      p.dsrc.finish(st, false);
    }
    if (!dw.defined()) {  // input half of a split backward
      st.wait();
      return;
    }
    // The forward's reordered input, kept in the state (the layer passes the same x).
    memory& xs = p.src_bw_shared ? p.src.inner() : p.src_bw.in(x.raw(), st);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, xs},
                                         {DNNL_ARG_DIFF_DST, p.g_bw(*g, st)},
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
    Arg src, wei, bia, dst;           // forward (dst unused with fused pooling)
    memory act, gact, ws;             // fused pooling: activation, its gradient, pooling indices
    pooling_v2_forward pfwd;
    pooling_v2_backward pbwd;
    Arg pdst, pddst;                  // pooled output / its gradient, plain <-> blocked
    bool own_maxpool_bwd = false;     // max pooling: inference forward + maxpool_backward()
    Layout act_layout, pool_layout;
    Arg gin;                          // unpooled: plain output gradient -> backward format
    Convert g_bd, g_bw;               // output gradient -> each backward primitive's format
    Arg wei_bd, dsrc, src_bw, dwei, dbia;
    bool src_bw_shared = false;
    memory scratch_f, scratch_bd, scratch_bw;
    Tensor masked;  // ReLU-masked output gradient (plain; pooled shape with fused max pooling)
    dt ot = dt::f32;  // the type the primitives write activations in (dst, diff_src; act, gact)
  };

  // Forward to backward, per micro-batch: the pre-pool activation and the
  // pooling workspace (fused pooling), the input in the primitives' layout
  // (when the weight backward reads it) and the pooled output in that layout
  // (this file's max-pool backward); bound to the plan's memories.
  struct Saved final : KernelState {
    Tensor act, ws, src, pooled;
  };
  void bind_state(Plan& p, Saved& sv_, bool backward) {
    auto bind = [&](Tensor& t, std::size_t bytes) {
      return backward ? kept_for_backward(t, bytes, "cpu Conv2d") : kept(t, bytes);
    };
    if (s_.fuse_pool) p.act.set_data_handle(bind(sv_.act, p.act.get_desc().get_size()));
    if (p.ws) p.ws.set_data_handle(bind(sv_.ws, p.ws.get_desc().get_size()));
    if (p.src_bw_shared && p.src.separate()) p.src.set_inner(bind(sv_.src, p.src.inner().get_desc().get_size()));
    if (p.own_maxpool_bwd && p.pdst.separate())
      p.pdst.set_inner(bind(sv_.pooled, p.pdst.inner().get_desc().get_size()));
  }

  // The activations' type; the weight must be of the same type (a bfloat16 copy for bf16).
  dt types(const Tensor& x, const Tensor& w, const char* what) const {
    const dt t = dnnl_type(x, "Conv2d input");
    RT_CHECK(dnnl_type(w, "Conv2d weight") == t, "cpu Conv2d ", what, ": the weight is ", dtype_name(w.dtype()),
             " but the input ", dtype_name(x.dtype()), " (bfloat16 activations take a bfloat16 weight copy)");
    return t;
  }

  // at: the activations' storage type.
  Plan& plan(const Shape& xs, dt at) {
    const auto key = std::make_pair(xs, int(at));
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    // bf16: the products read bfloat16 inputs, weights and output gradients
    // and accumulate in float32. float32 storage (math bf16 only): the reorders
    // into the primitives' layouts convert on the way and outputs stay float32;
    // oneDNN 2.6 ignores fpmath_mode for these convolutions on AVX512-BF16, so
    // without this bf16 ran as fp32. There, without bf16 instructions the
    // convolution stays float32 (with the fpmath permission). bfloat16 storage
    // always asks for bf16 products (emulated on AVX-512 without the
    // instructions, as Linear's matmuls; the log names the ISA). Where oneDNN
    // has no bf16 implementation for a shape, the products run in float32
    // between conversions of the bf16 data.
    if (at == dt::bf16 || (s_.math == MathMode::bf16 && native_bf16())) {
      try {
        return plans_.emplace(key, make_plan(xs, dt::bf16, at)).first->second;
      } catch (const dnnl::error&) {
      }
    }
    return plans_.emplace(key, make_plan(xs, dt::f32, at)).first->second;
  }

  // io: the type of the products' inputs (source, weights, output gradient);
  // at: the caller's activations (and weight copy).
  Plan make_plan(const Shape& xs, dt io, dt at) {
    const auto& s = s_;
    const memory::dim oh = (xs[2] + 2 * s.pad_h - s.dilation_h * (s.kernel_h - 1) - 1) / s.stride_h + 1;
    const memory::dim ow = (xs[3] + 2 * s.pad_w - s.dilation_w * (s.kernel_w - 1) - 1) / s.stride_w + 1;
    memory::dims src_d = dims4(xs), wei_d{s.out_channels, s.in_channels, s.kernel_h, s.kernel_w},
                 bia_d{s.out_channels}, dst_d{xs[0], s.out_channels, oh, ow}, strides{s.stride_h, s.stride_w},
                 dil{s.dilation_h - 1, s.dilation_w - 1}, pad{s.pad_h, s.pad_w};
    // bf16 products with bf16 storage write bf16; otherwise the outputs are float32.
    const dt ot = io == dt::bf16 && at == dt::bf16 ? dt::bf16 : dt::f32;
    auto any = [ot](const memory::dims& d) { return memory::desc(d, ot, tag::any); };
    auto in = [io](const memory::dims& d) { return memory::desc(d, io, tag::any); };
    auto src_p = plain_md(src_d, tag::nchw, at), wei_p = plain_md(wei_d, tag::oihw, at),
         dwei_p = plain_md(wei_d, tag::oihw), bia_p = plain_md(bia_d, tag::x), dst_p = plain_md(dst_d, tag::nchw, at);
    const DType adt = at == dt::bf16 ? DType::bf16 : DType::f32;
    auto& eng = d_->eng;
    primitive_attr attr = conv_attr();
    if (s.fuse_relu) {
      post_ops po;
      po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
      attr.set_post_ops(po);
    }
    // Without fused pooling the output is the caller's: ask for it plain only
    // if oneDNN would otherwise pick a blocked one anyway (it reorders either way).
    auto fd = s.bias ? convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                                 in(src_d), in(wei_d), bia_p, any(dst_d), strides, dil, pad, pad)
                     : convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                                 in(src_d), in(wei_d), any(dst_d), strides, dil, pad, pad);
    convolution_forward::primitive_desc fpd(fd, attr, eng);
    primitive_attr battr = conv_attr();
    convolution_backward_data::primitive_desc bdpd(
        convolution_backward_data::desc(algorithm::convolution_direct, any(src_d), in(wei_d), in(dst_d), strides,
                                        dil, pad, pad),
        battr, eng, fpd);
    convolution_backward_weights::primitive_desc bwpd = weights_pd(src_d, wei_d, bia_p, dst_d, strides, dil, pad, fpd, io);

    Plan p;
    p.ot = ot;
    p.fwd = convolution_forward(fpd);
    p.bwd_data = convolution_backward_data(bdpd);
    p.bwd_w = convolution_backward_weights(bwpd);
    // The forward's reordered input serves the weight backward where both take one layout: kept per micro-batch.
    p.src_bw_shared = bwpd.src_desc() == fpd.src_desc();
    p.src = Arg(src_p, fpd.src_desc(), eng, true, false, /*external_inner=*/p.src_bw_shared);
    p.wei = Arg(wei_p, fpd.weights_desc(), eng, true);
    if (s.bias) p.bia = Arg(bia_p, fpd.bias_desc(), eng, true);
    memory gsrc;  // what the conv backward receives before any format conversion
    if (s.fuse_pool) {
      const auto& q = s.pool;
      const memory::dim ph = (oh + 2 * q.pad_h - q.kernel_h) / q.stride_h + 1;
      const memory::dim pw = (ow + 2 * q.pad_w - q.kernel_w) / q.stride_w + 1;
      memory::dims pd_d{xs[0], s.out_channels, ph, pw}, k{q.kernel_h, q.kernel_w}, st{q.stride_h, q.stride_w},
          pdil{0, 0}, pl{q.pad_h, q.pad_w}, pr{(ph - 1) * q.stride_h + q.kernel_h - oh - q.pad_h,
                                               (pw - 1) * q.stride_w + q.kernel_w - ow - q.pad_w};
      const algorithm alg = q.kind == PoolKind::max ? algorithm::pooling_max : algorithm::pooling_avg_include_padding;
      p.act = memory(fpd.dst_desc(), eng, DNNL_MEMORY_NONE);  // bound to the micro-batch's state
      pooling_v2_forward::primitive_desc ppd(
          {prop_kind::forward_training, alg, fpd.dst_desc(), any(pd_d), st, k, pdil, pl, pr}, eng);
      pooling_v2_backward::primitive_desc pbpd({alg, fpd.dst_desc(), ppd.dst_desc(), st, k, pdil, pl, pr}, eng, ppd);
      p.own_maxpool_bwd = ot == dt::f32 && q.kind == PoolKind::max && Layout::of(fpd.dst_desc(), p.act_layout) &&
                          Layout::of(ppd.dst_desc(), p.pool_layout) &&
                          (p.act_layout.block == 8 || p.act_layout.block == 16) &&
                          p.act_layout.block == p.pool_layout.block && pbpd.diff_dst_desc() == ppd.dst_desc();
      p.pbwd = pooling_v2_backward(pbpd);
      if (p.own_maxpool_bwd || q.kind == PoolKind::avg) {  // no workspace needed
        p.pfwd = pooling_v2_forward(pooling_v2_forward::primitive_desc(
            {prop_kind::forward_inference, alg, fpd.dst_desc(), ppd.dst_desc(), st, k, pdil, pl, pr}, eng));
      } else {
        p.pfwd = pooling_v2_forward(ppd);
        if (ppd.workspace_desc().get_size() > 0) p.ws = memory(ppd.workspace_desc(), eng, DNNL_MEMORY_NONE);
      }
      // maxpool_backward() reads the pooled output in the primitives' layout: kept per micro-batch.
      p.pdst = Arg(plain_md(pd_d, tag::nchw, at), ppd.dst_desc(), eng, false, false, p.own_maxpool_bwd);
      p.pddst = Arg(plain_md(pd_d, tag::nchw, at), pbpd.diff_dst_desc(), eng, true);
      p.gact = memory(pbpd.diff_src_desc(), eng);
      RT_ASSERT(pbpd.diff_src_desc() == fpd.dst_desc());  // the ReLU mask is element-wise in one layout
      gsrc = p.gact;
      if (s.fuse_relu) p.masked = Tensor::empty(pd_d, adt);
    } else {
      p.dst = Arg(dst_p, fpd.dst_desc(), eng, false);
      p.gin = Arg(dst_p, bwpd.diff_dst_desc(), eng, true);
      gsrc = p.gin.inner();
      if (s.fuse_relu) p.masked = Tensor::empty({xs[0], s.out_channels, oh, ow}, adt);
    }
    p.g_bw = Convert(gsrc, bwpd.diff_dst_desc(), eng);
    p.g_bd = Convert(gsrc, bdpd.diff_dst_desc(), eng);
    p.wei_bd = Arg(wei_p, bdpd.weights_desc(), eng, true);
    p.dsrc = Arg(src_p, bdpd.diff_src_desc(), eng, false);
    p.src_bw = Arg(src_p, bwpd.src_desc(), eng, true);
    // Weight gradients always land in a separate buffer so that accumulation
    // is a reorder with a sum post-op.
    p.dwei = Arg(dwei_p, bwpd.diff_weights_desc(), eng, false, true);
    if (s.bias) p.dbia = Arg(bia_p, bwpd.diff_bias_desc(), eng, false, true);
    p.scratch_f = make_scratch(fpd, eng);
    p.scratch_bd = make_scratch(bdpd, eng);
    p.scratch_bw = make_scratch(bwpd, eng);
    return p;
  }

  // User scratchpad, and the down-conversion the spec's MathMode allows
  // (oneDNN 2.6 has no tf32 mode: tf32 stays strict, which the contract permits).
  primitive_attr conv_attr() const {
    primitive_attr a;
    a.set_scratchpad_mode(scratchpad_mode::user);
    if (s_.math == MathMode::bf16) a.set_fpmath_mode(fpmath_mode::bf16);
    else if (s_.math == MathMode::fp16) a.set_fpmath_mode(fpmath_mode::f16);
    return a;
  }

  // Few input channels (the first layer): blocked layouts would pad C up to
  // the block, multiplying the weight-gradient work; take the input as is.
  convolution_backward_weights::primitive_desc weights_pd(const memory::dims& src_d, const memory::dims& wei_d,
                                                          const memory::desc& bia_p, const memory::dims& dst_d,
                                                          const memory::dims& strides, const memory::dims& dil,
                                                          const memory::dims& pad,
                                                          const convolution_forward::primitive_desc& fpd, dt io) {
    auto any = [](const memory::dims& d) { return memory::desc(d, dt::f32, tag::any); };
    auto in = [io](const memory::dims& d) { return memory::desc(d, io, tag::any); };
    primitive_attr attr = conv_attr();
    auto make = [&](const memory::desc& src) {
      auto bwd = s_.bias ? convolution_backward_weights::desc(algorithm::convolution_direct, src, any(wei_d), bia_p,
                                                              in(dst_d), strides, dil, pad, pad)
                         : convolution_backward_weights::desc(algorithm::convolution_direct, src, any(wei_d),
                                                              in(dst_d), strides, dil, pad, pad);
      return convolution_backward_weights::primitive_desc(bwd, attr, d_->eng, fpd);
    };
    if (s_.in_channels < 8 && fpd.src_desc() == plain_md(src_d, tag::nchw, io)) {
      try {
        return make(plain_md(src_d, tag::nchw, io));
      } catch (const dnnl::error&) {
        // no implementation for a plain input: fall back to the preferred layout
      }
    }
    return make(in(src_d));
  }

  Conv2dSpec s_;
  DnnlPtr d_;
  std::map<std::pair<Shape, int>, Plan> plans_;  // per input shape and activation type
};

}  // namespace

std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dSpec& s, DnnlPtr d) {
  return std::make_unique<CpuConv2d>(s, std::move(d));
}

}  // namespace ringtrain::cpu
