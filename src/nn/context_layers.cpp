// The layers' context-parallel paths and the context loss (nn/context_parallel.hpp).
// TokenEmbedding and Dropout keep their whole-sequence code; these members
// (declared in their headers) run instead when a context group is set.
#include <algorithm>
#include <vector>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/context_parallel.hpp"
#include "ringtrain/nn/language.hpp"
#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/rng.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"
#include "ringtrain/nn/transformer.hpp"

namespace ringtrain {

Shape context_shape(const Shape& whole, const ContextGroup& g) {
  RT_CHECK(whole.size() >= 2 && whole[1] == g.seq, "context parallelism: expected [N, ", g.seq,
           " tokens, ...] (the model's sequence), got ", shape_str(whole));
  Shape s = whole;
  s[1] = g.local();
  return s;
}

namespace {

// The runs of real tokens among local tokens [i0, i0 + n) of rank r: each
// within one chunk (positions consecutive), the padding left out.
struct Run {
  std::int64_t local, pos, len;  // first local index, its global position, tokens
};
std::vector<Run> real_runs(const ContextGroup& g, int r, std::int64_t i0, std::int64_t n) {
  std::vector<Run> out;
  const std::int64_t c = g.chunk();
  for (std::int64_t i = i0; i < i0 + n;) {
    const std::int64_t end = std::min(i0 + n, (i / c + 1) * c), p = g.position(r, i);  // [i, end): one chunk
    const std::int64_t len = std::min(end - i, g.seq - p);
    if (len > 0) out.push_back({i, p, len});
    i = end;
  }
  return out;
}

}  // namespace

// Per sample, a run of real tokens as one strided copy on the tensors' device
// (the backend's copy_rows: memcpy per row on the CPU).
Tensor context_slice(const Tensor& whole, const ContextGroup& g) {
  const Device dev = whole.device();
  Tensor out = Tensor::zeros(context_shape(whole.shape(), g), whole.dtype(), dev);
  const std::int64_t n = whole.dim(0), T = g.seq, L = g.local();
  const std::size_t row = whole.nbytes() / std::size_t(std::max<std::int64_t>(1, n * T));  // bytes per token
  const char* src = static_cast<const char*>(whole.raw());
  char* dst = static_cast<char*>(out.raw());
  for (const Run& r : real_runs(g, g.rank, 0, L))
    backend_for(dev).copy_rows(dev, dst + std::size_t(r.local) * row, std::size_t(L) * row,
                               src + std::size_t(r.pos) * row, std::size_t(T) * row, std::size_t(r.len) * row,
                               std::size_t(n));
  return out;
}

// ---- layers -----------------------------------------------------------------
void TokenEmbedding::shard_context(std::shared_ptr<const ContextGroup> g) {
  RT_CHECK(g->seq <= positions_, "TokenEmbedding '", name_, "': ", g->seq, " tokens exceed its ", positions_,
           " positions");
  cp_ = std::move(g);
}

// This rank's ids (padding: token 0), looked up without positions (a split
// vocabulary: this tensor rank's rows, zeros for the others', summed over the
// tensor group: each row exactly; with sequence parallelism reduce-scattered
// to this tensor rank's 1/tensor of the local tokens), then the position rows
// of their global positions added (padding gets none). Float32 sums in the
// 1-rank order: the same values, bitwise.
Tensor TokenEmbedding::forward_context(const Tensor& x, Saved& sv) const {
  RT_CHECK(out_dt_ == DType::f32, "TokenEmbedding '", name_, "': parallel.context > 1 runs float32 activations");
  const ContextGroup& g = *cp_;
  const Tensor ids = context_slice(x, g);
  const std::int64_t n = x.dim(0), L = g.local(), d = dim_;
  ensure(sv.rows, {n * L}, DType::i32, x.device());
  std::int64_t ls = L, i0 = 0;  // the output's tokens per sample and the first one's local index
  if (scatter_) {
    Tensor part = g_.workspace(TpBuffer::gathered_grad, {n, L, d}, DType::f32, x.device());
    lookup(ids, Tensor{}, sv.rows, part);
    ensure(sv.y, seq_shard_shape(part.shape(), g_), DType::f32, x.device());
    seq_reduce_scatter(part, sv.y, g_);
    ls = L / g_.size;
    i0 = std::int64_t(g_.rank) * ls;
  } else {
    ensure(sv.y, {n, L, d}, DType::f32, x.device());
    lookup(ids, Tensor{}, sv.rows, sv.y);
    if (g_.size > 1) tp_all_reduce(sv.y, g_);
  }
  // y += pos per run of real tokens and sample (axpy with alpha 1: y + pos in float32, as the 1-rank lookup sums).
  for (const Run& r : real_runs(g, g.rank, i0, ls))
    for (std::int64_t s = 0; s < n; ++s) {
      Tensor yv = sv.y.flat_view((s * ls + r.local - i0) * d, r.len * d);
      be_->axpy(1.0, pos.flat_view(r.pos * d, r.len * d), yv);
    }
  return sv.y;
}

// Sequence parallelism: every local token's gradient, gathered over the tensor
// group, for the rows of this rank's vocabulary (as without context).
void TokenEmbedding::backward_context(const Tensor& dy_in, Saved& sv) const {
  const ContextGroup& g = *cp_;
  Tensor dy = dy_in;
  if (scatter_) {
    dy = g_.workspace(TpBuffer::gathered_grad, seq_whole_shape(dy_in.shape(), g_), dy_in.dtype(), dy_in.device());
    seq_all_gather(dy_in, dy, g_);
  }
  Tensor dw = dweight, none;
  be_->embedding_backward(dy, sv.rows, dw, none);
  // dpos[t] += dy[s, i] in sample order (the 1-rank adjoint's token order): per sample, a run at a time.
  const std::int64_t n = dy.dim(0), L = g.local(), d = dim_;
  Tensor dp = dpos;
  for (std::int64_t s = 0; s < n; ++s)
    for (const Run& r : real_runs(g, g.rank, 0, L)) {
      Tensor pv = dp.flat_view(r.pos * d, r.len * d);
      be_->axpy(1.0, dy.flat_view((s * L + r.local) * d, r.len * d), pv);
    }
}

// Each run of local tokens within one chunk is one run of the whole [N, T, F]
// activation's elements; a chunk's padding continues the run (its mask is
// never used). Sequence parallelism (token shard index_ of token_parts_):
// this tensor rank's part of the local tokens, cut where a chunk ends.
Tensor Dropout::forward_context(const Tensor& x, Saved& s, std::uint64_t stream, std::int64_t first_sample) const {
  const ContextGroup& g = *cp_;
  RT_CHECK(parts_ == 1, "Dropout '", name_, "': a feature shard of the tensor ranks does not combine with "
           "parallel.context yet");
  const std::int64_t n = x.dim(0), L = g.local(), c = g.chunk();
  RT_CHECK(L % token_parts_ == 0, "Dropout '", name_, "': this rank's ", L, " tokens are not divisible by the ",
           token_parts_, " sequence-parallel ranks");
  const std::int64_t ls = L / token_parts_, i0 = token_parts_ > 1 ? std::int64_t(index_) * ls : 0;
  RT_CHECK(x.ndim() >= 2 && x.dim(1) == ls, "Dropout '", name_, "': expects this rank's ", ls, " tokens, got ",
           shape_str(x.shape()));
  const std::int64_t f = x.numel() / (n * ls);  // elements per token
  for (std::int64_t sm = 0; sm < n; ++sm)
    for (std::int64_t a = 0; a < ls;) {
      const std::int64_t k = (i0 + a) / c, b = std::min(ls, (k + 1) * c - i0);  // [a, b): within chunk k
      const std::int64_t off = (sm * ls + a) * f, cnt = (b - a) * f;
      const std::int64_t first =
          ((first_sample + sm) * g.seq + std::int64_t(g.chunk_of(g.rank, int(k))) * c + (i0 + a - k * c)) * f;
      Tensor yv = s.y.flat_view(off, cnt), mv = s.mask.flat_view(off, cnt);
      be_->dropout_forward(x.flat_view(off, cnt), p_, seed_, stream, static_cast<std::uint64_t>(first), mv, yv);
      a = b;
    }
  return s.y;
}

void MultiHeadSelfAttention::shard_context(std::shared_ptr<const ContextGroup> g) {
  RT_CHECK(causal_, "MultiHeadSelfAttention '", name_, "': only causal attention runs over parallel.context");
  cp_ = std::move(g);
}

namespace {

void shard_one(Layer& l, const std::shared_ptr<const ContextGroup>& g) {
  if (auto* e = dynamic_cast<TokenEmbedding*>(&l)) return e->shard_context(g);
  if (auto* d = dynamic_cast<Dropout*>(&l)) return d->shard_context(g);
  if (auto* a = dynamic_cast<MultiHeadSelfAttention*>(&l)) return a->shard_context(g);  // its projections act per token
  const std::string t = l.type();
  RT_CHECK(t != "TokenMean" && t != "PatchEmbed", "layer '", l.name(), "' (", t,
           ") does not run on a context shard of the tokens (parallel.context)");
  l.for_each_child([&](Layer& c) { shard_one(c, g); });
}

class ContextLoss final : public Loss {
 public:
  ContextLoss(LossPtr inner, ContextGroup g) : inner_(std::move(inner)), g_(std::move(g)) {}
  std::string name() const override { return inner_->name() + " (context-parallel)"; }
  // Every context rank takes part (and every tensor rank of a vocabulary-split inner loss); rank 0 records.
  bool collective() const override { return true; }

  double value_and_grad(const Tensor& out, const Tensor& y, Tensor& grad) const override {
    Picked p = pick(out, y);
    Tensor gr = grad.defined() ? Tensor::empty(p.logits.shape(), DType::f32, out.device()) : Tensor{};
    const double mean = p.count ? inner_->value_and_grad(p.logits, p.labels, gr) : 0.0;
    double v[2] = {mean * double(p.count), double(p.count)};
    bounded::allreduce(v, 2, MPI_DOUBLE, MPI_SUM, WaitOn(g_.comm, "context loss"),
                       "the context-parallel loss: the sum over the context ranks");
    if (grad.defined()) {
      // d(sequence mean)/d logits = d(local mean)·count/total, times P: the gradient sync averages over context.
      // Placed per run as axpy into zeros: a * g in float32, the padding rows zero.
      grad.zero_();
      const double a = double(float(double(p.count) / v[1] * double(g_.size)));
      const std::int64_t V = out.dim(-1), L = g_.local();
      std::int64_t k = 0;
      for (std::int64_t s = 0; s < out.dim(0); ++s)
        for (const Run& r : p.runs) {
          Tensor gv = grad.flat_view((s * L + r.local) * V, r.len * V);
          backend_for(out.device()).axpy(a, gr.flat_view(k * V, r.len * V), gv);
          k += r.len;
        }
    }
    return v[0] / v[1];
  }

  std::int64_t correct(const Tensor& out, const Tensor& y) const override {
    Picked p = pick(out, y);
    double c = p.count ? double(inner_->correct(p.logits, p.labels)) : 0.0;
    bounded::allreduce(&c, 1, MPI_DOUBLE, MPI_SUM, WaitOn(g_.comm, "context loss"),
                       "the context-parallel accuracy: the sum over the context ranks");
    return static_cast<std::int64_t>(c);
  }

 private:
  struct Picked {
    std::vector<Run> runs;  // this rank's real tokens, the same in every sample
    Tensor logits, labels;  // [count, V], [count]: per sample, its runs in order
    std::int64_t count = 0;
  };
  // The logits of this rank's real tokens and their labels: a strided copy per
  // run (all samples at once) on the tensors' devices.
  Picked pick(const Tensor& out, const Tensor& y) const {
    RT_CHECK(out.dtype() == DType::f32 && out.ndim() == 3 && out.dim(1) == g_.local(), "context loss: expected "
             "float32 logits [N, ", g_.local(), ", V], got ", dtype_name(out.dtype()), " ", shape_str(out.shape()));
    RT_CHECK(y.ndim() == 2 && y.dim(0) == out.dim(0) && y.dim(1) == g_.seq, "context loss: labels ",
             shape_str(y.shape()), " for logits ", shape_str(out.shape()), " (expected [N, ", g_.seq, "])");
    Picked p;
    const std::int64_t n = out.dim(0), L = g_.local(), T = g_.seq, V = out.dim(-1);
    p.runs = real_runs(g_, g_.rank, 0, L);
    std::int64_t per = 0;  // real tokens per sample
    for (const Run& r : p.runs) per += r.len;
    p.count = n * per;
    p.logits = Tensor::empty({p.count, V}, DType::f32, out.device());
    p.labels = Tensor::empty({p.count}, y.dtype(), y.device());
    const std::size_t ls = dtype_size(y.dtype()), lv = std::size_t(V) * 4;
    const char* src = static_cast<const char*>(out.raw());
    const char* ys = static_cast<const char*>(y.raw());
    char *dl = static_cast<char*>(p.logits.raw()), *dy = static_cast<char*>(p.labels.raw());
    std::int64_t k = 0;  // the run's first row in a sample's share of the picked rows
    for (const Run& r : p.runs) {
      backend_for(out.device()).copy_rows(out.device(), dl + std::size_t(k) * lv, std::size_t(per) * lv,
                                          src + std::size_t(r.local) * lv, std::size_t(L) * lv,
                                          std::size_t(r.len) * lv, std::size_t(n));
      backend_for(y.device()).copy_rows(y.device(), dy + std::size_t(k) * ls, std::size_t(per) * ls,
                                        ys + std::size_t(r.pos) * ls, std::size_t(T) * ls, std::size_t(r.len) * ls,
                                        std::size_t(n));
      k += r.len;
    }
    return p;
  }
  LossPtr inner_;
  ContextGroup g_;
};

}  // namespace

void shard_context(std::vector<LayerPtr>& layers, const ContextGroup& g) {
  RT_CHECK(!layers.empty() && dynamic_cast<TokenEmbedding*>(layers.front().get()), "parallel.context = ", g.size,
           ": the model must start with a token embedding (a language model: 'gpt')");
  auto shared = std::make_shared<const ContextGroup>(g);
  for (auto& l : layers) shard_one(*l, shared);
}

LossPtr context_loss(LossPtr inner, const ContextGroup& g) {
  RT_CHECK(inner != nullptr, "parallel.context: no loss to wrap");
  return std::make_shared<ContextLoss>(std::move(inner), g);
}

}  // namespace ringtrain
