// BatchNorm2d on oneDNN. The primitives run in the channel-blocked layout
// (nChw8c/16c: oneDNN's JIT kernel, about 2x faster than its plain-NCHW one
// even with the reorders), the reorders cached per shape. Train: batch statistics from the forward
// primitive, running statistics updated here with PyTorch's rule (unbiased
// variance). Eval: oneDNN with global statistics. The eval-mode backward (rare:
// frozen-BN fine-tuning) is a direct formula, since it is just an affine map.
// Data (x, y, dy, dx) are float32 or bfloat16 (train.precision = bf16
// storage: oneDNN normalises bf16 data in float32 registers); scale, shift,
// statistics and their gradients are always float32.
#include <cmath>
#include <map>
#include <vector>

#include "cpu_backend.hpp"
#include "ringtrain/core/cpu.hpp"

namespace ringtrain::cpu {
namespace {

using namespace dnnl;
using nf = normalization_flags;

class CpuBatchNorm final : public BatchNormKernel {
 public:
  CpuBatchNorm(const BatchNormSpec& s, DnnlPtr d) : s_(s), d_(std::move(d)) {
    RT_CHECK(s.dtype == DType::f32, "cpu BatchNorm2d: parameters must be float32, got ", dtype_name(s.dtype));
    const memory::dims c{s.channels};
    mean_ = memory(plain_md(c, tag::x), d_->eng, DNNL_MEMORY_NONE);
    var_ = memory(plain_md(c, tag::x), d_->eng, DNNL_MEMORY_NONE);
    dscale_ = memory(plain_md(c, tag::x), d_->eng);
    dshift_ = memory(plain_md(c, tag::x), d_->eng);
    bytes_ = static_cast<std::size_t>(s.channels) * sizeof(float);
  }

  KernelStatePtr make_state() const override { return std::make_unique<Saved>(); }

  void forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& rmean, Tensor& rvar, bool train,
               Tensor& y, KernelState& ks) override {
    Saved& sv_ = state_as<Saved>(ks, "cpu BatchNorm2d");
    const dt t = dnnl_type(x, "BatchNorm2d input");
    RT_CHECK(dnnl_type(y, "BatchNorm2d output") == t, "cpu BatchNorm2d: output dtype differs from the input's");
    Plan& p = plan(x.shape(), t);
    auto& st = d_->strm;
    auto wrap = [&](const Tensor& t, const memory::desc& md) { return memory(md, d_->eng, t.raw()); };
    const auto cmd = plain_md({s_.channels}, tag::x);
    if (p.src.separate()) p.src.set_inner(kept(sv_.src, p.src.inner().get_desc().get_size()));
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, p.src.in(x.raw(), st)},
                                         {DNNL_ARG_DST, p.dst.out(y.raw())},
                                         {DNNL_ARG_SCALE, wrap(gamma, cmd)},
                                         {DNNL_ARG_SHIFT, wrap(beta, cmd)}};
    sv_.train = train;
    if (train) {
      mean_.set_data_handle(kept(sv_.mean, bytes_));
      var_.set_data_handle(kept(sv_.var, bytes_));
      args.emplace(DNNL_ARG_MEAN, mean_);
      args.emplace(DNNL_ARG_VARIANCE, var_);
      args.emplace(DNNL_ARG_SCRATCHPAD, p.scratch_t);
      p.fwd_train.execute(st, args);
      p.dst.finish(st, false);
      st.wait();
      // PyTorch: running = (1 - m) running + m batch, with the unbiased variance.
      const double cnt = double(x.numel() / s_.channels), m = s_.momentum;
      const float* bm = static_cast<float*>(mean_.get_data_handle());
      const float* bv = static_cast<float*>(var_.get_data_handle());
      float* rm = rmean.data<float>();
      float* rv = rvar.data<float>();
      for (std::int64_t c = 0; c < s_.channels; ++c) {
        rm[c] = static_cast<float>((1 - m) * rm[c] + m * bm[c]);
        rv[c] = static_cast<float>((1 - m) * rv[c] + m * bv[c] * cnt / (cnt - 1));
      }
    } else {
      args.emplace(DNNL_ARG_MEAN, wrap(rmean, cmd));
      args.emplace(DNNL_ARG_VARIANCE, wrap(rvar, cmd));
      args.emplace(DNNL_ARG_SCRATCHPAD, p.scratch_e);
      p.fwd_eval.execute(st, args);
      p.dst.finish(st, false);
      st.wait();
      sv_.eval_mean = rmean;
      sv_.eval_var = rvar;
    }
  }

  void backward(const Tensor& x, const Tensor& gamma, const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                bool accumulate, KernelState& ks) override {
    Saved& sv_ = state_as<Saved>(ks, "cpu BatchNorm2d");
    const dt t = dnnl_type(x, "BatchNorm2d input");
    RT_CHECK(dnnl_type(dy, "BatchNorm2d gradient") == t && dnnl_type(dx, "BatchNorm2d dx") == t,
             "cpu BatchNorm2d: gradient dtypes differ from the input's");
    Plan& p = plan(x.shape(), t);
    if (!sv_.train) return eval_backward(x, gamma, dy, dx, dgamma, dbeta, accumulate, sv_);
    mean_.set_data_handle(kept_for_backward(sv_.mean, bytes_, "cpu BatchNorm2d"));
    var_.set_data_handle(kept_for_backward(sv_.var, bytes_, "cpu BatchNorm2d"));
    auto& st = d_->strm;
    auto wrap = [&](const Tensor& t, const memory::desc& md) { return memory(md, d_->eng, t.raw()); };
    const auto cmd = plain_md({s_.channels}, tag::x);
    memory dsc = accumulate ? dscale_ : wrap(dgamma, cmd), dsh = accumulate ? dshift_ : wrap(dbeta, cmd);
    // The forward's reordered input (kept in the state; the layer passes the same x).
    if (p.src.separate()) {
      p.src.set_inner(kept_for_backward(sv_.src, p.src.inner().get_desc().get_size(), "cpu BatchNorm2d"));
    } else {
      p.src.in(x.raw(), st);  // the plain input itself: no reorder
    }
    p.bwd.execute(st, {{DNNL_ARG_SRC, p.src.inner()},
                       {DNNL_ARG_MEAN, mean_},
                       {DNNL_ARG_VARIANCE, var_},
                       {DNNL_ARG_DIFF_DST, p.ddst.in(dy.raw(), st)},
                       {DNNL_ARG_SCALE, wrap(gamma, cmd)},
                       {DNNL_ARG_SHIFT, dshift_},  // unused by the math, required by oneDNN 2.6's argument check
                       {DNNL_ARG_DIFF_SRC, p.dsrc.out(dx.raw())},
                       {DNNL_ARG_DIFF_SCALE, dsc},
                       {DNNL_ARG_DIFF_SHIFT, dsh},
                       {DNNL_ARG_SCRATCHPAD, p.scratch_b}});
    p.dsrc.finish(st, false);
    st.wait();
    if (accumulate) {
      add_into(dgamma.data<float>(), static_cast<float*>(dscale_.get_data_handle()), s_.channels);
      add_into(dbeta.data<float>(), static_cast<float*>(dshift_.get_data_handle()), s_.channels);
    }
  }

 private:
  struct Plan {
    memory::desc md;  // the primitives' layout
    Arg src, dst, ddst, dsrc;
    batch_normalization_forward fwd_train, fwd_eval;
    batch_normalization_backward bwd;
    memory scratch_t, scratch_e, scratch_b;
  };

  // y = gamma (x - rm) / sqrt(rv + eps) + beta: an affine map per channel.
  // bfloat16 data: widened to float32 first, dx rounded once at the end.
  struct Saved;
  void eval_backward(const Tensor& x, const Tensor& gamma, const Tensor& dy, Tensor& dx, Tensor& dgamma,
                     Tensor& dbeta, bool accumulate, const Saved& sv_) {
    if (x.dtype() == DType::bf16) {
      Tensor x32 = Tensor::empty(x.shape()), dy32 = Tensor::empty(x.shape()), dx32 = Tensor::empty(x.shape());
      bf16_to_f32(x.data<bfloat16>(), x32.data<float>(), x.numel());
      bf16_to_f32(dy.data<bfloat16>(), dy32.data<float>(), x.numel());
      eval_backward(x32, gamma, dy32, dx32, dgamma, dbeta, accumulate, sv_);
      f32_to_bf16(dx32.data<float>(), dx.data<bfloat16>(), x.numel());
      return;
    }
    const std::int64_t n = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3);
    const float *px = x.data<float>(), *pd = dy.data<float>(), *g = gamma.data<float>();
    const float *rm = sv_.eval_mean.data<float>(), *rv = sv_.eval_var.data<float>();
    float* pdx = dx.data<float>();
    float* dg = dgamma.data<float>();
    float* db = dbeta.data<float>();
#pragma omp parallel for schedule(static)
    for (std::int64_t ch = 0; ch < c; ++ch) {
      const double inv = 1.0 / std::sqrt(double(rv[ch]) + s_.eps);
      double sg = 0, sb = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t o = (i * c + ch) * hw;
        for (std::int64_t k = 0; k < hw; ++k) {
          sb += pd[o + k];
          sg += pd[o + k] * (px[o + k] - rm[ch]) * inv;
          pdx[o + k] = static_cast<float>(pd[o + k] * g[ch] * inv);
        }
      }
      dg[ch] = static_cast<float>((accumulate ? dg[ch] : 0.0) + sg);
      db[ch] = static_cast<float>((accumulate ? db[ch] : 0.0) + sb);
    }
  }

  // t: the data's type. bfloat16 runs bf16 primitives where oneDNN has them,
  // else float32 ones between conversions (the Args' reorders).
  Plan& plan(const Shape& xs, dt t) {
    const auto key = std::make_pair(xs, int(t));
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    if (t == dt::bf16) {
      try {
        return plans_.emplace(key, make_plan(xs, t, dt::bf16)).first->second;
      } catch (const dnnl::error&) {
      }
    }
    return plans_.emplace(key, make_plan(xs, t, dt::f32)).first->second;
  }

  // t: the caller's data; pt: the primitives'.
  Plan make_plan(const Shape& xs, dt t, dt pt) {
    auto& eng = d_->eng;
    Plan p;
    const auto plain = plain_md(dims4(xs), tag::nchw, t);
    const bool b16 = cpu_features().avx512f && s_.channels % 16 == 0;
    p.md = b16 ? plain_md(dims4(xs), tag::aBcd16b, pt)
               : s_.channels % 8 == 0 && cpu_features().avx2 ? plain_md(dims4(xs), tag::aBcd8b, pt)
                                                              : plain_md(dims4(xs), tag::nchw, pt);
    p.src = Arg(plain, p.md, eng, true, false, /*external_inner=*/true);
    p.dst = Arg(plain, p.md, eng, false);
    p.ddst = Arg(plain, p.md, eng, true);
    p.dsrc = Arg(plain, p.md, eng, false);
    const float eps = static_cast<float>(s_.eps);
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    batch_normalization_forward::primitive_desc tpd(
        {prop_kind::forward_training, p.md, eps, nf::use_scale | nf::use_shift}, attr, eng);
    batch_normalization_forward::primitive_desc epd(
        {prop_kind::forward_inference, p.md, eps, nf::use_scale | nf::use_shift | nf::use_global_stats}, attr, eng);
    batch_normalization_backward::primitive_desc bpd(
        {prop_kind::backward, p.md, p.md, eps, nf::use_scale | nf::use_shift}, attr, eng, tpd);
    p.fwd_train = batch_normalization_forward(tpd);
    p.fwd_eval = batch_normalization_forward(epd);
    p.bwd = batch_normalization_backward(bpd);
    p.scratch_t = make_scratch(tpd, eng);
    p.scratch_e = make_scratch(epd, eng);
    p.scratch_b = make_scratch(bpd, eng);
    return p;
  }

  BatchNormSpec s_;
  DnnlPtr d_;
  memory mean_, var_, dscale_, dshift_;  // mean_, var_: bound to the state's buffers
  std::size_t bytes_ = 0;                // of a statistic: channels floats
  // Forward to backward: the batch statistics, the input in the primitives'
  // layout, and in eval mode the running statistics used.
  struct Saved final : KernelState {
    Tensor mean, var, src;
    bool train = true;
    Tensor eval_mean, eval_var;
  };
  std::map<std::pair<Shape, int>, Plan> plans_;  // per input shape and data type
};

}  // namespace

std::unique_ptr<BatchNormKernel> make_batchnorm(const BatchNormSpec& s, DnnlPtr d) {
  return std::make_unique<CpuBatchNorm>(s, std::move(d));
}

}  // namespace ringtrain::cpu
