// CudaBackend: the Backend object registered for DeviceKind::cuda. Layer
// kernels come from conv.cpp, linear.cpp, bn_pool.cpp; the element-wise ops,
// dropout and the loss use our kernels (kernels/*.cu) on the compute stream.
#include "nn/common.hpp"
#include "nn/moe_ops.hpp"
#include "ringtrain/cuda/kernels.hpp"
#include "ringtrain/cuda/memory.hpp"

namespace ringtrain::cuda {
namespace nnimpl {
namespace {

class CudaEltwise final : public EltwiseKernel {
 public:
  CudaEltwise(SharedPtr sh, Eltwise op, DType dt) : sh_(std::move(sh)), op_(op), dt_(dt) {}
  void forward(const Tensor& x, Tensor& y) override {
    const DType t = act_type(x, dt_, "eltwise forward", "x");
    expect_cuda(y, t, "eltwise forward", "y");
    RT_CHECK(x.numel() == y.numel(), "eltwise forward: x has ", x.numel(), " elements, y ", y.numel());
    cudaStream_t s = sh_->ctx(x).compute();
    if (op_ == Eltwise::relu) relu_forward(y.raw(), x.raw(), x.numel(), t, s);
    else gelu_forward(y.raw(), x.raw(), x.numel(), t, op_ == Eltwise::gelu_tanh, s);
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override {
    const DType t = act_type(dy, dt_, "eltwise backward", "dy");
    expect_cuda(dx, t, "eltwise backward", "dx");
    expect_cuda(op_ == Eltwise::relu ? y : x, t, "eltwise backward", op_ == Eltwise::relu ? "y" : "x");
    cudaStream_t s = sh_->ctx(dy).compute();
    if (op_ == Eltwise::relu) relu_backward(dx.raw(), dy.raw(), y.raw(), dy.numel(), t, s);
    else gelu_backward(dx.raw(), dy.raw(), x.raw(), dy.numel(), t, op_ == Eltwise::gelu_tanh, s);
  }

 private:
  SharedPtr sh_;
  Eltwise op_;
  DType dt_;
};

// A broadcast parameter's dtype beside activations x: x's, or float32 beside bfloat16/float16.
DType param_type(const Tensor& x, const Tensor& b) {
  const bool half = x.dtype() == DType::bf16 || x.dtype() == DType::f16;
  return half && b.dtype() == DType::f32 ? DType::f32 : x.dtype();
}

// x's [outer, m, inner] view for an add_broadcast of m entries over `inner` elements each.
std::int64_t broadcast_outer(const Tensor& x, std::int64_t m, std::int64_t inner, const char* what) {
  const std::int64_t per = m * inner, outer = per > 0 ? x.numel() / per : 0;
  RT_CHECK(m > 0 && inner > 0 && outer * per == x.numel(), what, ": ", m, " entries over ", inner,
           " elements each do not broadcast over ", shape_str(x.shape()));
  return outer;
}

// Loss results come back through pinned memory: one stream sync per call.
struct LossSlots {
  float loss;
  int correct;
  int bad_label;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& o) : sh_(std::make_shared<Shared>(o)) {}

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string name() const override {
    int v = cudnnGetVersion();
    return cat("cuda (cuDNN ", v / 10000, ".", (v / 100) % 100, " + cuBLAS)");
  }
  std::unique_ptr<Conv2dKernel> conv2d(const Conv2dSpec& s) override { return make_conv2d(sh_, s); }
  std::unique_ptr<LinearKernel> linear(const LinearSpec& s) override { return make_linear(sh_, s); }
  std::unique_ptr<BatchNormKernel> batchnorm(const BatchNormSpec& s) override { return make_batchnorm(sh_, s); }
  std::unique_ptr<Pool2dKernel> pool2d(const Pool2dSpec& s) override { return make_pool2d(sh_, s); }
  std::unique_ptr<EltwiseKernel> eltwise(Eltwise op, DType dt) override {
    return std::make_unique<CudaEltwise>(sh_, op, dt);
  }

  std::unique_ptr<LayerNormKernel> layernorm(const LayerNormSpec& s) override { return make_layernorm(sh_, s); }
  std::unique_ptr<AttentionKernel> attention(const AttentionSpec& s) override { return make_attention(sh_, s); }

  void patchify(const Tensor& x, std::int64_t p, Tensor& out) override { patches(x, p, out, true); }
  void unpatchify(const Tensor& dout, std::int64_t p, Tensor& dx) override { patches(dx, p, dout, false); }
  // b (and db) have the activations' dtype, or float32 beside 16-bit activations (a parameter).
  void add_broadcast(const Tensor& x, const Tensor& b, std::int64_t inner, Tensor& out) override {
    expect_cuda(x, x.dtype(), "add_broadcast", "x");
    expect_cuda(b, param_type(x, b), "add_broadcast", "b");
    expect_cuda(out, x.dtype(), "add_broadcast", "out");
    const std::int64_t m = b.numel(), outer = broadcast_outer(x, m, inner, "add_broadcast");
    RT_CHECK(out.numel() == x.numel(), "add_broadcast: out ", shape_str(out.shape()), " is not x's size ",
             shape_str(x.shape()));
    cudaStream_t s = sh_->ctx(x).compute();
    if (out.raw() != x.raw()) RT_CUDA(cudaMemcpyAsync(out.raw(), x.raw(), x.nbytes(), cudaMemcpyDeviceToDevice, s));
    bias_add(out.raw(), b.raw(), outer, m, inner, false, x.dtype(), b.dtype(), s);
  }
  // Rows (inner = 1): a column sum over [rows, m]; pixels of a channel (inner > 1): one block per channel.
  void sum_broadcast(const Tensor& dy, std::int64_t inner, Tensor& db, bool accumulate) override {
    expect_cuda(dy, dy.dtype(), "sum_broadcast", "dy");
    expect_cuda(db, param_type(dy, db), "sum_broadcast", "db");
    const std::int64_t m = db.numel(), outer = broadcast_outer(dy, m, inner, "sum_broadcast");
    cudaStream_t s = sh_->ctx(dy).compute();
    if (inner == 1) column_sum(dy.raw(), db.raw(), outer, m, accumulate, dy.dtype(), db.dtype(), s);
    else bias_grad(db.raw(), dy.raw(), outer, m, inner, accumulate, dy.dtype(), db.dtype(), s);
  }
  void token_mean(const Tensor& x, Tensor& y) override {
    expect_cuda(x, x.dtype(), "token_mean", "x");
    expect_cuda(y, x.dtype(), "token_mean", "y");
    RT_CHECK(x.ndim() == 3 && y.numel() == x.dim(0) * x.dim(2), "token_mean: x ", shape_str(x.shape()),
             " is not [N, T, D] or y ", shape_str(y.shape()), " is not [N, D]");
    cuda::token_mean(x.raw(), y.raw(), x.dim(0), x.dim(1), x.dim(2), x.dtype(), sh_->ctx(x).compute());
  }
  void token_mean_backward(const Tensor& dy, Tensor& dx) override {
    expect_cuda(dy, dy.dtype(), "token_mean backward", "dy");
    expect_cuda(dx, dy.dtype(), "token_mean backward", "dx");
    RT_CHECK(dx.ndim() == 3 && dy.numel() == dx.dim(0) * dx.dim(2), "token_mean backward: dx ",
             shape_str(dx.shape()), " is not [N, T, D] or dy ", shape_str(dy.shape()), " is not [N, D]");
    cuda::token_mean_backward(dy.raw(), dx.raw(), dx.dim(0), dx.dim(1), dx.dim(2), dy.dtype(),
                              sh_->ctx(dy).compute());
  }

  void add(const Tensor& a, const Tensor& b, Tensor& out) override {
    expect_cuda(a, a.dtype(), "add", "a");
    expect_cuda(b, a.dtype(), "add", "b");
    expect_cuda(out, a.dtype(), "add", "out");
    RT_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add: sizes differ (", a.numel(), ", ", b.numel(),
             ", ", out.numel(), ")");
    axpby(out.raw(), a.raw(), b.raw(), 1.0f, 1.0f, a.numel(), a.dtype(), sh_->ctx(a).compute());
  }
  void axpy(double alpha, const Tensor& x, Tensor& y) override {
    expect_cuda(x, y.dtype(), "axpy", "x");
    expect_cuda(y, y.dtype(), "axpy", "y");
    RT_CHECK(x.numel() == y.numel(), "axpy: x has ", x.numel(), " elements, y ", y.numel());
    axpby(y.raw(), x.raw(), y.raw(), static_cast<float>(alpha), 1.0f, y.numel(), y.dtype(), sh_->ctx(y).compute());
  }
  void dropout_forward(const Tensor& x, double p, std::uint64_t seed, std::uint64_t stream, std::uint64_t first,
                       Tensor& mask, Tensor& y) override {
    expect_cuda(x, x.dtype(), "dropout forward", "x");
    expect_cuda(mask, DType::u8, "dropout forward", "mask");
    expect_cuda(y, x.dtype(), "dropout forward", "y");
    RT_CHECK(mask.numel() == x.numel() && y.numel() == x.numel(), "dropout forward: x, mask, y sizes differ");
    cuda::dropout_forward(y.raw(), mask.device_data<std::uint8_t>(), x.raw(), x.numel(), x.dtype(), static_cast<float>(p),
                          seed, stream, first, sh_->ctx(x).compute());
  }
  void dropout_backward(const Tensor& dy, const Tensor& mask, double p, Tensor& dx) override {
    expect_cuda(dy, dy.dtype(), "dropout backward", "dy");
    expect_cuda(mask, DType::u8, "dropout backward", "mask");
    expect_cuda(dx, dy.dtype(), "dropout backward", "dx");
    cuda::dropout_backward(dx.raw(), dy.raw(), mask.device_data<std::uint8_t>(), dy.numel(), dy.dtype(),
                           static_cast<float>(p), sh_->ctx(dy).compute());
  }
  double softmax_xent(const Tensor& logits, const Tensor& labels, double smoothing, Tensor& dlogits) override {
    return run_xent(logits, labels, smoothing, dlogits.defined() ? &dlogits : nullptr).loss;
  }
  std::int64_t count_correct(const Tensor& logits, const Tensor& labels) override {
    return run_xent(logits, labels, 0.0, nullptr).correct;
  }

  // The vocabulary-parallel loss's local steps (kernels/vocab_parallel.cu); nn/lm_loss.cpp sums between them.
  void vocab_row_max(const Tensor& logits, const Tensor& labels, int part, Tensor& maxes, Tensor& best) override {
    const char* what = "vocab-parallel cross-entropy";
    VocabSlice a = vocab_slice(logits, labels.defined() ? &labels : nullptr, part, maxes, what);
    if (best.defined()) {
      expect_cuda(best, DType::i64, what, "best");
      RT_CHECK(best.numel() == a.rows, what, ": best ", shape_str(best.shape()), " is not [", a.rows, "]");
    }
    CudaContext& c = sh_->ctx(logits);
    auto* bad = static_cast<unsigned long long*>(scratch_.get(64, logits.device()));
    if (a.labels) RT_CUDA(cudaMemsetAsync(bad, 0xff, sizeof *bad, c.compute()));
    cuda::vocab_row_max(a, maxes.device_data<float>(), best.defined() ? best.device_data<std::int64_t>() : nullptr,
                        a.labels ? bad : nullptr, c.compute());
    if (!a.labels) return;
    // A bad label is an error naming it on every rank before the group's all-reduce: one read-back.
    const unsigned long long row = read_back<unsigned long long>(bad, c);
    if (row == ~0ull) return;
    std::int64_t y = 0;
    RT_CUDA(cudaMemcpy(&y, a.labels + row, sizeof y, cudaMemcpyDeviceToHost));
    RT_FAIL(what, ": label ", y, " of row ", row, " is not in [0, ", a.parts * a.local, ")");
  }
  void vocab_xent_sums(const Tensor& logits, const Tensor& labels, int part, const Tensor& maxes,
                       Tensor& sums) override {
    const char* what = "vocab-parallel cross-entropy";
    const VocabSlice a = vocab_slice(logits, &labels, part, maxes, what);
    expect_cuda(sums, DType::f64, what, "sums");
    RT_CHECK(sums.numel() == 2 * a.rows, what, ": sums ", shape_str(sums.shape()), " is not [2, ", a.rows, "]");
    cuda::vocab_xent_sums(a, maxes.device_data<float>(), sums.device_data<double>(), sh_->ctx(logits).compute());
  }
  double vocab_xent_finish(const Tensor& logits, const Tensor& labels, int part, const Tensor& maxes,
                           const Tensor& sums, Tensor& dlogits) override {
    const char* what = "vocab-parallel cross-entropy";
    const VocabSlice a = vocab_slice(logits, &labels, part, maxes, what);
    expect_cuda(sums, DType::f64, what, "sums");
    RT_CHECK(sums.numel() == 2 * a.rows, what, ": sums ", shape_str(sums.shape()), " is not [2, ", a.rows, "]");
    if (dlogits.defined()) {
      expect_cuda(dlogits, DType::f32, what, "dlogits");
      RT_CHECK(dlogits.shape() == logits.shape(), what, ": dlogits must match the logits ", shape_str(logits.shape()));
    }
    CudaContext& c = sh_->ctx(logits);
    auto* loss = static_cast<double*>(scratch_.get(64 + std::size_t(a.rows) * sizeof(double), logits.device()));
    cuda::vocab_xent_finish(a, maxes.device_data<float>(), sums.device_data<double>(),
                            dlogits.defined() ? dlogits.device_data<float>() : nullptr, loss + 8, loss, c.compute());
    return read_back<double>(loss, c);
  }
  void vocab_count_hits(const Tensor& maxes, const Tensor& best, const Tensor& labels, int part, std::int64_t first,
                        Tensor& hits) override {
    const char* what = "vocab-parallel accuracy";
    expect_cuda(maxes, DType::f32, what, "maxes");
    expect_cuda(best, DType::i64, what, "best");
    expect_cuda(labels, DType::i64, what, "labels");
    expect_cuda(hits, DType::f64, what, "hits");
    RT_CHECK(maxes.ndim() == 2 && best.numel() == maxes.dim(0) && labels.numel() == maxes.dim(0) && hits.numel() == 1,
             what, ": maxes ", shape_str(maxes.shape()), ", best ", shape_str(best.shape()), ", labels ",
             shape_str(labels.shape()), " and hits ", shape_str(hits.shape()), " do not fit");
    VocabSlice a;
    a.labels = labels.device_data<std::int64_t>();
    a.rows = maxes.dim(0);
    a.first = first;
    a.part = part;
    a.parts = static_cast<int>(maxes.dim(1));
    cuda::vocab_count_hits(a, maxes.device_data<float>(), best.device_data<std::int64_t>(),
                           hits.device_data<double>(), sh_->ctx(maxes).compute());
  }

  // Ring attention's blocks (context parallelism, kernels/ring_attention.cu); nn/ring_attention.cpp runs the ring.
  void ring_block_forward(const Tensor& qkv, const Tensor& kv, const RingBlockSpec& b, bool first, Tensor& acc,
                          Tensor& m, Tensor& l, Tensor&, const std::function<void()>&) override {
    const char* what = "ring attention block forward";
    const RingBlockArgs a = ring_args(qkv, kv, b, what);
    ring_expect(acc, a.n * a.L * a.heads * a.hd, what, "acc");
    ring_expect(m, a.n * a.heads * a.L, what, "m");
    ring_expect(l, a.n * a.heads * a.L, what, "l");
    cuda::ring_block_forward(a, first, acc.device_data<float>(), m.device_data<float>(), l.device_data<float>(),
                             sh_->ctx(qkv).compute());
  }
  void ring_block_finish(const Tensor& acc, const Tensor& m, const Tensor& l, std::int64_t heads, Tensor& out,
                         Tensor& lse) override {
    const char* what = "ring attention finish";
    RT_CHECK(acc.ndim() == 3 && heads > 0 && acc.dim(2) % heads == 0, what, ": acc ", shape_str(acc.shape()),
             " is not [N, L, ", heads, " heads x head width]");
    const std::int64_t n = acc.dim(0), L = acc.dim(1), hd = acc.dim(2) / heads;
    ring_expect(acc, acc.numel(), what, "acc");
    ring_expect(out, acc.numel(), what, "out");
    ring_expect(m, n * heads * L, what, "m");
    ring_expect(l, n * heads * L, what, "l");
    ring_expect(lse, n * heads * L, what, "lse");
    cuda::ring_block_finish(acc.device_data<float>(), m.device_data<float>(), l.device_data<float>(), n, L, heads, hd,
                            out.device_data<float>(), lse.device_data<float>(), sh_->ctx(acc).compute());
  }
  void attention_rowdot(const Tensor& out, const Tensor& dout, std::int64_t heads, Tensor& D) override {
    const char* what = "attention row dot";
    RT_CHECK(out.ndim() == 3 && heads > 0 && out.dim(2) % heads == 0, what, ": out ", shape_str(out.shape()),
             " is not [N, L, ", heads, " heads x head width]");
    const std::int64_t n = out.dim(0), L = out.dim(1), hd = out.dim(2) / heads;
    ring_expect(out, out.numel(), what, "out");
    ring_expect(dout, out.numel(), what, "dout");
    ring_expect(D, n * heads * L, what, "D");
    cuda::attention_rowdot(out.device_data<float>(), dout.device_data<float>(), n, L, heads, hd,
                           D.device_data<float>(), sh_->ctx(out).compute());
  }
  void ring_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& dout, const Tensor& lse,
                           const Tensor& D, const RingBlockSpec& b, Tensor& dqkv, Tensor& dkv, Tensor&,
                           const std::function<void()>&) override {
    const char* what = "ring attention block backward";
    const RingBlockArgs a = ring_args(qkv, kv, b, what);
    ring_expect(dout, a.n * a.L * a.heads * a.hd, what, "dout");
    ring_expect(lse, a.n * a.heads * a.L, what, "lse");
    ring_expect(D, a.n * a.heads * a.L, what, "D");
    ring_expect(dqkv, qkv.numel(), what, "dqkv");
    ring_expect(dkv, kv.numel(), what, "dkv");
    cuda::ring_block_backward(a, dout.device_data<float>(), lse.device_data<float>(), D.device_data<float>(),
                              dqkv.device_data<float>(), dkv.device_data<float>(), sh_->ctx(qkv).compute());
  }

  void embedding_forward(const Tensor& ids, std::int64_t vocab, std::int64_t first, const Tensor& weight,
                         const Tensor& pos, Tensor& rows, Tensor& y) override {
    expect_cuda(ids, DType::f32, "embedding forward", "ids");
    expect_cuda(weight, DType::f32, "embedding forward", "weight");
    expect_cuda(rows, DType::i32, "embedding forward", "rows");
    expect_cuda(y, y.dtype(), "embedding forward", "y");
    RT_CHECK(ids.ndim() == 2 && weight.ndim() == 2 && rows.numel() == ids.numel() &&
                 y.numel() == ids.numel() * weight.dim(1),
             "embedding forward: ids ", shape_str(ids.shape()), ", weight ", shape_str(weight.shape()), ", rows ",
             shape_str(rows.shape()), ", y ", shape_str(y.shape()), " do not fit");
    const std::int64_t t = ids.dim(1), d = weight.dim(1);
    const std::size_t n = static_cast<std::size_t>(ids.numel());
    if (pos.defined()) {
      expect_cuda(pos, DType::f32, "embedding forward", "pos");
      RT_CHECK(pos.dim(0) >= t && pos.dim(1) == d, "embedding forward: pos ", shape_str(pos.shape()), " for ", t,
               " tokens of width ", d);
    }
    CudaContext& ctx = sh_->ctx(ids);
    cudaStream_t s = ctx.compute();
    Tensor bad = Tensor::empty({1}, DType::i64, ids.device());
    RT_CUDA(cudaMemsetAsync(bad.raw(), 0xff, sizeof(unsigned long long), s));
    embedding_rows(ids.device_data<float>(), rows.device_data<std::int32_t>(),
                   static_cast<unsigned long long*>(bad.raw()), n, vocab, first, weight.dim(0), s);
    embedding_lookup(rows.device_data<std::int32_t>(), weight.device_data<float>(),
                     pos.defined() ? pos.device_data<float>() : nullptr, y.raw(), n, t, d, y.dtype(), s);
    // A bad token id is an error naming the input, as on the CPU: one read-back per batch.
    unsigned long long first_bad = 0;
    RT_CUDA(cudaMemcpyAsync(&first_bad, bad.raw(), sizeof first_bad, cudaMemcpyDeviceToHost, s));
    ctx.sync_compute();
    if (first_bad != ~0ull) {
      float v = 0;
      RT_CUDA(cudaMemcpy(&v, ids.device_data<float>() + first_bad, sizeof v, cudaMemcpyDeviceToHost));
      RT_FAIL("input ", first_bad, " = ", v, " is not a token id in [0, ", vocab, ")");
    }
  }
  void embedding_backward(const Tensor& dy, const Tensor& rows, Tensor& dweight, Tensor& dpos) override {
    expect_cuda(dy, dy.dtype(), "embedding backward", "dy");
    expect_cuda(rows, DType::i32, "embedding backward", "rows");
    expect_cuda(dweight, DType::f32, "embedding backward", "dweight");
    RT_CHECK(dy.ndim() == 3 && dy.dim(0) * dy.dim(1) == rows.numel() && dweight.ndim() == 2 &&
                 dweight.dim(1) == dy.dim(2),
             "embedding backward: dy ", shape_str(dy.shape()), ", rows ", shape_str(rows.shape()), ", dweight ",
             shape_str(dweight.shape()), " do not fit");
    const std::int64_t t = dy.dim(1), d = dy.dim(2);
    if (dpos.defined()) {
      expect_cuda(dpos, DType::f32, "embedding backward", "dpos");
      RT_CHECK(dpos.dim(0) >= t && dpos.dim(1) == d, "embedding backward: dpos ", shape_str(dpos.shape()), " for ",
               t, " tokens of width ", d);
    }
    const std::size_t n = static_cast<std::size_t>(rows.numel()), bytes = embedding_backward_scratch_bytes(n);
    Tensor scratch = Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::u8, dy.device());
    cuda::embedding_backward(dy.raw(), dy.dtype(), rows.device_data<std::int32_t>(), dweight.device_data<float>(),
                             dpos.defined() ? dpos.device_data<float>() : nullptr, n, t, d, scratch.raw(), bytes,
                             sh_->ctx(dy).compute());
  }

  // bfloat16 activations (train.precision = bf16): every kernel above takes
  // bf16 x/y/dx/dy through its float32 kernel, with float32 parameters (a
  // Linear's weight a bf16 copy) and float32 parameter gradients; cuBLAS
  // multiplies bf16 with float32 accumulation, our kernels compute in float.
  // The convolution, batch-norm and pooling kernels too (bf16_images: conv.cpp,
  // bn_pool.cpp; 16-bit data through cuDNN, float32 parameters, statistics
  // and parameter gradients). The trainer's gate keeps them at float32 storage
  // until the feature "16-bit storage of convolutions" is verified (docs/gpu.md).
  // float16 the same way (train.precision = fp16, the loss scaled before the
  // stage's cast): every template above is instantiated for float16 too.
  // ---- mixture of experts (nn/moe.cpp, kernels/moe.cu) ----
  void moe_route(Tensor& probs, const Tensor& bias, int k, Tensor& expert, Tensor& gate, Tensor& psum) override {
    nnimpl::moe_route(*sh_, probs, bias, k, expert, gate, psum);
  }
  void moe_gather_rows(const Tensor& src, const Tensor& idx, Tensor& dst) override {
    nnimpl::moe_gather_rows(*sh_, src, idx, dst);
  }
  void moe_combine(const Tensor& rows, const Tensor& row, const Tensor& gate, int k, const Tensor& tokens, Tensor& y,
                   bool accumulate) override {
    nnimpl::moe_combine(*sh_, rows, row, gate, k, tokens, y, accumulate);
  }
  void moe_combine_backward(const Tensor& dy, const Tensor& rows, const Tensor& row, const Tensor& gate, int k,
                            Tensor& dgate, Tensor& drows) override {
    nnimpl::moe_combine_backward(*sh_, dy, rows, row, gate, k, dgate, drows);
  }
  void moe_router_backward(const Tensor& probs, const Tensor& expert, const Tensor& gate, const Tensor& dgate,
                           const Tensor& f, double aux_g, Tensor& dlogit) override {
    nnimpl::moe_router_backward(*sh_, probs, expert, gate, dgate, f, aux_g, dlogit);
  }
  void batched_gemm(Device dev, const BatchedGemm& g) override { nnimpl::batched_gemm(*sh_, dev, g); }
  // ---- end mixture of experts ----
  bool bf16_activations() const override { return true; }
  bool fp16_activations() const override { return true; }
  bool bf16_images() const override { return true; }
  std::string bf16_isa() const override { return "CUDA tensor cores (cuBLAS, float32 accumulation)"; }
  void cast(const Tensor& src, Tensor& dst) override {
    expect_cuda(src, src.dtype(), "cast", "src");
    expect_cuda(dst, dst.dtype(), "cast", "dst");
    RT_CHECK(src.numel() == dst.numel(), "cast: sizes differ: ", shape_str(src.shape()), " vs ",
             shape_str(dst.shape()));
    cuda::cast(dst.raw(), dst.dtype(), src.raw(), src.dtype(), static_cast<std::size_t>(src.numel()),
               sh_->ctx(src).compute());
  }

  void copy_rows(Device dev, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                 std::size_t width, std::size_t rows) override {
    RT_CHECK(dev.is_cuda(), "copy_rows: the CUDA backend copies device memory, got ", dev.str());
    if (!rows || !width) return;
    RT_CUDA(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice,
                              sh_->ctx(dev.index).compute()));
  }

  // Gradients reported by a stage's grad-ready hook are complete once this returns.
  void synchronize() override { sh_->sync_all(); }

  CudaContext& context(int device) { return sh_->ctx(device); }

 private:
  LossSlots run_xent(const Tensor& logits, const Tensor& labels, double smoothing, Tensor* dlogits) {
    const char* what = "softmax_xent";
    expect_cuda(logits, logits.dtype(), what, "logits");
    expect_cuda(labels, labels.dtype(), what, "labels");
    RT_CHECK(logits.ndim() == 2 && labels.ndim() == 1 && labels.dim(0) == logits.dim(0), what, ": logits ",
             shape_str(logits.shape()), " and labels ", shape_str(labels.shape()), " do not match ([N, K] and [N])");
    CudaContext& c = sh_->ctx(logits);
    int rows = static_cast<int>(logits.dim(0));
    XentArgs a;
    a.logits = logits.raw();
    a.logits_dtype = logits.dtype();
    a.labels = labels.raw();
    a.labels_dtype = labels.dtype();
    a.rows = rows;
    a.classes = static_cast<int>(logits.dim(1));
    a.smoothing = static_cast<float>(smoothing);
    if (dlogits) {
      expect_cuda(*dlogits, logits.dtype(), what, "dlogits");
      a.dlogits = dlogits->raw();
    }
    char* dev = static_cast<char*>(scratch_.get(xent_scratch_bytes(rows) + 64, logits.device()));
    auto* slots = reinterpret_cast<LossSlots*>(dev);
    RT_CUDA(cudaMemsetAsync(slots, 0, sizeof(LossSlots), c.compute()));
    a.loss = &slots->loss;
    a.correct = &slots->correct;
    a.bad_label = &slots->bad_label;
    cuda::softmax_xent(a, dev + 64, c.compute());
    host_.reserve(sizeof(LossSlots));  // lazily: no CUDA work before select_device
    RT_CUDA(cudaMemcpyAsync(host_.data(), slots, sizeof(LossSlots), cudaMemcpyDeviceToHost, c.compute()));
    c.sync_compute();
    LossSlots r = *host_.as<LossSlots>();
    RT_CHECK(!r.bad_label, what, ": a label is outside [0, ", a.classes, ")");
    return r;
  }

  // Ring attention's arguments, checked (float32 device tensors of the block's shapes).
  static void ring_expect(const Tensor& t, std::int64_t numel, const char* what, const char* arg) {
    expect_cuda(t, DType::f32, what, arg);
    RT_CHECK(t.numel() == numel, what, ": ", arg, " ", shape_str(t.shape()), " has ", t.numel(), " elements, expected ",
             numel);
  }
  static RingBlockArgs ring_args(const Tensor& qkv, const Tensor& kv, const RingBlockSpec& b, const char* what) {
    const std::int64_t d = b.heads * b.head_dim;
    expect_cuda(qkv, DType::f32, what, "qkv");
    RT_CHECK(qkv.ndim() == 3 && qkv.dim(1) == 2 * b.chunk && qkv.dim(2) == 3 * d, what, ": qkv ",
             shape_str(qkv.shape()), " is not [N, ", 2 * b.chunk, ", ", 3 * d, "]");
    ring_expect(kv, qkv.dim(0) * qkv.dim(1) * 2 * d, what, "kv");
    RingBlockArgs a;
    a.qkv = qkv.device_data<float>();
    a.kv = kv.device_data<float>();
    a.n = qkv.dim(0), a.L = qkv.dim(1), a.heads = b.heads, a.hd = b.head_dim, a.chunk = b.chunk, a.scale = b.scale;
    for (int k = 0; k < 2; ++k) a.qc[k] = b.q_chunks[k], a.kc[k] = b.k_chunks[k];
    return a;
  }
  // The logits' slice for the vocabulary-parallel kernels, checked.
  static VocabSlice vocab_slice(const Tensor& logits, const Tensor* labels, int part, const Tensor& maxes,
                                const char* what) {
    expect_cuda(logits, DType::f32, what, "logits");
    expect_cuda(maxes, DType::f32, what, "maxes");
    RT_CHECK(logits.ndim() == 2 && maxes.ndim() == 2 && maxes.dim(0) == logits.dim(0) && part >= 0 &&
                 part < maxes.dim(1),
             what, ": logits ", shape_str(logits.shape()), " and maxes ", shape_str(maxes.shape()),
             " are not [rows, vocab / parts] and [rows, parts] with part ", part, " among them");
    VocabSlice a;
    a.logits = logits.device_data<float>();
    a.rows = logits.dim(0);
    a.local = logits.dim(1);
    a.part = part;
    a.parts = static_cast<int>(maxes.dim(1));
    a.first = std::int64_t(part) * a.local;
    if (labels) {
      expect_cuda(*labels, DType::i64, what, "labels");
      RT_CHECK(labels->numel() == a.rows, what, ": labels ", shape_str(labels->shape()), " are not [", a.rows, "]");
      a.labels = labels->device_data<std::int64_t>();
    }
    return a;
  }
  // One device value, after the compute stream's work: through pinned memory.
  template <typename T>
  T read_back(const void* dev, CudaContext& c) {
    host_.reserve(sizeof(T));
    RT_CUDA(cudaMemcpyAsync(host_.data(), dev, sizeof(T), cudaMemcpyDeviceToHost, c.compute()));
    c.sync_compute();
    return *host_.as<T>();
  }

  // img [N, C, H, W] <-> tokens [N, T, C*p*p]
  void patches(const Tensor& img, std::int64_t p, const Tensor& tokens, bool to_tokens) {
    const char* what = to_tokens ? "patchify" : "unpatchify";
    expect_cuda(img, img.dtype(), what, "image");
    expect_cuda(tokens, img.dtype(), what, "tokens");
    RT_CHECK(img.ndim() == 4 && p > 0 && img.dim(2) % p == 0 && img.dim(3) % p == 0 &&
                 tokens.numel() == img.numel(),
             what, ": image ", shape_str(img.shape()), " and tokens ", shape_str(tokens.shape()), " do not match ",
             p, "x", p, " patches");
    cuda::patch_copy(img.raw(), tokens.raw(), img.dim(0), img.dim(1), img.dim(2), img.dim(3), p, to_tokens,
                     img.dtype(), sh_->ctx(img).compute());
  }

  SharedPtr sh_;
  Scratch scratch_;
  PinnedBuffer host_;
};

}  // namespace
}  // namespace nnimpl

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opt) {
  return std::make_unique<nnimpl::CudaBackend>(opt);
}

CudaContext& backend_context(int device) {
  auto& b = backend_for(DeviceKind::cuda);
  auto* cb = dynamic_cast<nnimpl::CudaBackend*>(&b);
  RT_CHECK(cb != nullptr, "the backend registered for cuda is not ringtrain's CUDA backend");
  return cb->context(device);
}

}  // namespace ringtrain::cuda
