// MoeMlp (nn/moe.hpp): routing, the token exchange with the experts' ranks,
// the experts' GEMMs (moe_gemm.hpp: one grouped call per matrix) and the
// combine, forward and backward. Row-major float32 on the host; the loops are
// Backend ops (backend.hpp, "mixture of experts"), which the device path
// (moe_device.cpp) calls on device tensors too.
#include "ringtrain/nn/moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "init.hpp"
#include "moe_dispatch.hpp"
#include "moe_gemm.hpp"
#include "moe_stats.hpp"
#include "ringtrain/comm/alltoall.hpp"
#include "ringtrain/nn/mesh_dims.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"

namespace ringtrain {

namespace {

// b[j] = alpha * sum over rows of x[m, n] (+ b when accumulating).
// Row by row (the matrix is row-major: one pass over memory).
void sum_rows(const float* x, std::int64_t m, std::int64_t n, float alpha, float* b, bool accumulate) {
  std::vector<double> s(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) s[j] += x[i * n + j];
  for (std::int64_t j = 0; j < n; ++j) b[j] = static_cast<float>(alpha * s[j] + (accumulate ? b[j] : 0.f));
}

// A host vector as a tensor (the Backend ops' operands on the CPU).
template <class T>
Tensor host(std::vector<T>& v, const Shape& shape) {
  return Tensor::wrap(v.data(), shape, dtype_of<T>::value, Device::cpu());
}

// y[m, n] += bias broadcast over rows.
void add_bias(float* y, const float* b, std::int64_t m, std::int64_t n) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) y[i * n + j] += b[j];
}

}  // namespace

MoeMlp::MoeMlp(std::string name, const MoeSpec& s, ExpertGroup g)
    : Layer(std::move(name)), spec_(s), group_(std::move(g)) {
  RT_CHECK(s.dim > 0 && s.hidden > 0, "MoE layer '", name_, "': width (", s.dim, ") and hidden units (", s.hidden,
           ") must be positive");
  RT_CHECK(s.experts >= 1, "MoE layer '", name_, "': model.experts must be >= 1, got ", s.experts);
  RT_CHECK(s.top_k >= 1 && s.top_k <= s.experts, "MoE layer '", name_, "': model.top_k = ", s.top_k,
           " must be in [1, model.experts = ", s.experts, "]");
  RT_CHECK(group_.size >= 1 && s.experts % group_.size == 0, "MoE layer '", name_, "': model.experts = ", s.experts,
           " is not divisible by parallel.expert = ", group_.size);
  RT_CHECK(s.capacity_factor >= 0 && s.aux_loss_coeff >= 0 && s.bias_update_rate >= 0, "MoE layer '", name_,
           "': model.capacity_factor, model.aux_loss_coeff and model.moe_bias_update_rate must be >= 0");
  if (s.bias_update_rate > 0) bias_ = Tensor::zeros({s.experts}, DType::f32, Device::cpu());
}

std::vector<NamedBuffer> MoeMlp::buffers() const {
  if (!bias_.defined()) return {};
  return {{(full_name_.empty() ? name_ : full_name_) + ".expert_bias", bias_, {}}};
}

std::vector<double> MoeMlp::take_load() {
  std::lock_guard<std::mutex> lock(load_mu_);
  std::vector<double> out = load_;
  out.resize(static_cast<std::size_t>(spec_.experts), 0.0);
  load_.assign(static_cast<std::size_t>(spec_.experts), 0.0);
  return out;
}

void MoeMlp::update_bias(const std::vector<double>& load) {
  RT_CHECK(bias_.defined() && load.size() == static_cast<std::size_t>(spec_.experts), "MoE layer '", name_,
           "': update_bias needs model.moe_bias_update_rate > 0 and ", spec_.experts, " loads, got ", load.size());
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / double(load.size());
  float* b = bias_.data<float>();
  for (std::size_t e = 0; e < load.size(); ++e)
    b[e] += static_cast<float>(spec_.bias_update_rate * double((load[e] < mean) - (load[e] > mean)));
}

MoeMlp::~MoeMlp() {
  if (bias_.defined()) group_.shared->remove_balanced(this);
}

CtxPtr MoeMlp::make_ctx() const { return ctx_of<Saved>(); }

void MoeMlp::register_params(ParamArena& arena, int li, const std::string& prefix) {
  const std::int64_t D = spec_.dim, H = spec_.hidden;
  full_name_ = prefix + name_;
  router_ = add_param(arena, prefix, "router.weight", {spec_.experts, D}, DType::f32, true, li);
  // Initial values are keyed by the parameter's index in the whole model: a rank
  // holding experts [lo, hi) gives them the indices they have with every expert
  // here, and the parameters after this layer the indices they have then.
  const std::size_t base = arena.model_index(router_) + 1;
  const int L = local_experts(), lo = first_expert();
  arena.set_index_base(base + 4 * std::size_t(lo));
  const bool split = group_.size > 1;
  for (int l = 0; l < L; ++l) {
    const std::string e = cat("experts.", lo + l, ".");
    w1_.push_back(add_param(arena, prefix, e + "fc1.weight", {H, D}, DType::f32, true, li));
    b1_.push_back(add_param(arena, prefix, e + "fc1.bias", {H}, DType::f32, false, li));
    w2_.push_back(add_param(arena, prefix, e + "fc2.weight", {D, H}, DType::f32, true, li));
    b2_.push_back(add_param(arena, prefix, e + "fc2.bias", {D}, DType::f32, false, li));
    // Held by the ranks with the same experts only: averaged over the expert-data group.
    if (split)
      for (std::size_t p : {w1_.back(), b1_.back(), w2_.back(), b2_.back()}) arena.set_reduce_over(p, kExpertReduce);
  }
  arena.set_index_base(base + 4 * std::size_t(spec_.experts));
}

void MoeMlp::bind(const BindContext& ctx) {
  RT_CHECK((ctx.device.is_cpu() && !spec_.device_path) || seq_.size == 1, "MoE layer '", name_,
           "': sequence parallelism (parallel.sequence) with model.experts > 0 runs on the CPU only");
  be_ = &ctx.backend;
  arena_ = &ctx.arena;
  if (bias_.defined()) group_.shared->add_balanced(this);
  gelu_ = ctx.backend.eltwise(spec_.gelu, DType::f32);
  // The grouped GEMM reads every local expert's fc1 (fc2) weight from the first's
  // pointer: the arena lays each expert's four tensors out alike, so they sit
  // at one stride, in the parameters and in the gradients.
  wstride_ = 0;
  for (const auto* w : {&w1_, &w2_})
    for (std::size_t l = 1; l < w->size(); ++l) {
      const std::int64_t d =
          ctx.arena.param((*w)[l]).device_data<float>() - ctx.arena.param((*w)[0]).device_data<float>();
      const std::int64_t g =
          ctx.arena.grad((*w)[l]).device_data<float>() - ctx.arena.grad((*w)[0]).device_data<float>();
      if (l == 1 && w == &w1_) wstride_ = d;
      RT_CHECK(d == std::int64_t(l) * wstride_ && g == d, "MoE layer '", name_,
               "': the experts' weights are not evenly spaced in the parameter arena");
    }
  // Sequence parallelism: one buffer spanning every gradient of the layer (the
  // padding between them stays zero), so that one all-reduce sums them all.
  partial_ = Tensor();
  if (seq_.size > 1) {
    const float* flat = ctx.arena.grads_flat(DType::f32).data<float>();
    std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = 0;
    for (std::size_t p : layer_params()) {
      const Tensor g = ctx.arena.grad(p);
      RT_CHECK(g.dtype() == DType::f32, "MoE layer '", name_, "': float32 gradients only");
      lo = std::min<std::int64_t>(lo, g.data<float>() - flat);
      hi = std::max<std::int64_t>(hi, g.data<float>() - flat + g.numel());
    }
    grad_lo_ = lo;
    partial_ = Tensor::zeros({hi - lo}, DType::f32, Device::cpu());
  }
}

std::vector<std::size_t> MoeMlp::layer_params() const {
  std::vector<std::size_t> out{router_};
  for (std::size_t l = 0; l < w1_.size(); ++l) out.insert(out.end(), {w1_[l], b1_[l], w2_[l], b2_[l]});
  return out;
}

float* MoeMlp::grad_ptr(std::size_t p) const {
  float* g = arena_->grad(p).data<float>();
  if (seq_.size == 1) return g;
  return partial_.data<float>() + (g - arena_->grads_flat(DType::f32).data<float>() - grad_lo_);
}

void MoeMlp::init(const ParamArena& arena, std::uint64_t seed) {
  const double D = double(spec_.dim), H = double(spec_.hidden);
  detail::init_weight(arena, router_, Init::xavier_uniform, D, double(spec_.experts), seed);
  for (std::size_t l = 0; l < w1_.size(); ++l) {
    detail::init_weight(arena, w1_[l], Init::xavier_uniform, D, H, seed);
    detail::fill_param(arena, b1_[l], 0.0);
    detail::init_weight(arena, w2_[l], Init::xavier_uniform, H, D, seed);
    detail::fill_param(arena, b2_[l], 0.0);
  }
  if (bias_.defined()) detail::fill_tensor(bias_, 0.0);
}

Shape MoeMlp::output_shape(const Shape& in) const {
  RT_CHECK(in.size() >= 2 && in.back() == spec_.dim, "MoE layer '", name_, "': expects input [..., ", spec_.dim,
           "], got ", shape_str(in));
  return in;
}

double MoeMlp::forward_flops(const Shape& in) const {
  const double n = double(shape_numel(in) / spec_.dim), D = double(spec_.dim), H = double(spec_.hidden);
  return 2 * n * D * spec_.experts + 2 * n * spec_.top_k * 2 * D * H;
}

Tensor MoeMlp::do_forward(const Tensor& x, Ctx& c, const Call& call) const {
  Saved& s = saved<Saved>(c);
  RT_CHECK(x.dtype() == DType::f32, "MoE layer '", name_, "': needs float32 tensors, got ", dtype_name(x.dtype()));
  if (!x.device().is_cpu() || spec_.device_path) return device_forward(x, s, call);
  const std::int64_t D = spec_.dim, H = spec_.hidden, n = x.numel() / D;
  const int E = spec_.experts, k = spec_.top_k, L = local_experts(), p = group_.size;
  s.x = x;
  const float* xp = x.data<float>();
  const float* wr = arena_->param(router_).data<float>();
  // Router: logits in fp32, softmax (in double), top-k, renormalised gates (Backend::moe_route).
  s.probs.assign(static_cast<std::size_t>(n * E), 0.f);
  be_->batched_gemm(Device::cpu(), {false, true, n, E, D, 1.f, xp, D, 0, wr, D, 0, 0.f, s.probs.data(), E, 0, 1});
  s.expert.assign(static_cast<std::size_t>(n * k), -1);
  s.gate.assign(static_cast<std::size_t>(n * k), 0.f);
  std::vector<double> psum(static_cast<std::size_t>(E));
  {
    Tensor probs = host(s.probs, {n, E}), expert = host(s.expert, {n, k}), gate = host(s.gate, {n, k});
    Tensor ps = host(psum, {E});
    be_->moe_route(probs, bias_, k, expert, gate, ps);
  }
  plan_dispatch(s, x, psum.data(), call);
  for (std::size_t a = 0; a < s.expert.size(); ++a)
    if (s.row[a] >= 0) std::memcpy(&s.send[std::size_t(s.row[a]) * D], xp + (a / k) * D, sizeof(float) * D);
  const auto R = static_cast<std::int64_t>(s.perm.size());
  const std::int64_t M = s.stride;
  s.oe.resize(static_cast<std::size_t>(L * M * D));
  if (R > 0) {
    ensure(s.xe, {L * M, D}, DType::f32, Device::cpu());
    ensure(s.h, {L * M, H}, DType::f32, Device::cpu());
    ensure(s.a, {L * M, H}, DType::f32, Device::cpu());
    float* xe = s.xe.data<float>();
    float* h = s.h.data<float>();
    for (int l = 0; l < L; ++l) {  // pad rows: zero input, and so (bias left out) zero fc1 output
      std::fill(xe + (l * M + s.rows[l]) * D, xe + (l + 1) * M * D, 0.f);
      std::fill(h + (l * M + s.rows[l]) * H, h + (l + 1) * M * H, 0.f);
    }
    if (!s.gemm) s.gemm = std::make_shared<detail::ExpertGemm>(spec_.gemm);
  }
  // Overlap: this rank's own rows go through the experts while the others' travel.
  const bool overlap = spec_.overlap && p > 1, split = overlap && spec_.gemm != ExpertGemmMode::dnnl_grouped;
  detail::RowExchange ex(group_, L, D);
  ex.start(s, s.send, s.recv, true, overlap);
  const detail::RowSplit rs = detail::row_split(s, p, L, group_.rank);
  auto gather = [&](int which) {  // received rows -> expert blocks (0: own, 1: the others', 2: all)
    for (std::int64_t i = 0; i < R; ++i)
      if (which == 2 || rs.is_own(s.perm[i]) == (which == 0))
        std::memcpy(s.xe.data<float>() + s.slot[i] * D, &s.recv[s.perm[i] * D], sizeof(float) * D);
  };
  if (split) {
    gather(0);
    expert_forward(s, rs.zero, s.own, &ex);
    ex.wait_received();  // our rows' sends complete at the combine's start
    gather(1);
    expert_forward(s, s.own, rs.remote, nullptr);
  } else {
    ex.wait();
    gather(2);
    expert_forward(s, rs.zero, s.rows, nullptr);
  }
  s.out_recv.resize(s.recv.size());
  for (std::int64_t i = 0; i < R; ++i)
    std::memcpy(&s.out_recv[s.perm[i] * D], s.oe.data() + s.slot[i] * D, sizeof(float) * D);
  ex.start(s, s.out_recv, s.out_send, false, overlap);
  // Combine: y[t] = sum_j gate_j * expert output, in j order. Tokens whose kept
  // assignments all went to this rank's experts need nothing of the exchange:
  // combined while it travels (the sum's order is the same).
  ensure(s.y, x.shape(), DType::f32, Device::cpu());
  Tensor row = host(s.row, {n * k}), gate = host(s.gate, {n * k});
  std::vector<std::int64_t> tokens[2];  // the local tokens, the others (Backend::moe_combine)
  if (overlap)
    for (std::int64_t t = 0; t < n; ++t) tokens[detail::token_is_local(s, t, k, L, group_.rank) ? 0 : 1].push_back(t);
  auto combine = [&](int which) {  // 0: local tokens, 1: the others, 2: all
    const Tensor list = which == 2 ? Tensor() : host(tokens[which], {std::int64_t(tokens[which].size())});
    const Tensor out = host(s.out_send, {std::int64_t(s.out_send.size()) / D, D});
    be_->moe_combine(out, row, gate, k, list, s.y, false);
  };
  if (overlap) combine(0);
  ex.wait();
  combine(overlap ? 1 : 2);
  return s.y;
}

void MoeMlp::plan_dispatch(Saved& s, const Tensor& x, const double* psum, const Call& call) const {
  const std::int64_t D = spec_.dim, n = x.numel() / D;
  const int E = spec_.experts, k = spec_.top_k, L = local_experts(), p = group_.size;
  // This rank's counts per row (a sample's tokens; one row unless the capacity
  // needs the token order), then its probability sums: the routing totals.
  const bool capped = spec_.capacity_factor > 0;
  const std::int64_t rows = capped && x.ndim() >= 3 ? x.dim(0) : 1, per_row = std::max<std::int64_t>(1, n / rows);
  std::vector<double> local(static_cast<std::size_t>(rows * E + E), 0.0);
  double* mean_p = &local[static_cast<std::size_t>(rows * E)];
  std::copy(psum, psum + E, mean_p);
  for (std::size_t a = 0; a < s.expert.size(); ++a)
    local[static_cast<std::size_t>((std::int64_t(a) / k / per_row) * E + s.expert[a])] += 1;
  // The whole micro-batch's totals: this rank's, or (sequence parallelism) the
  // tensor group's, so that the aux loss, its gradient, the drops, the loads
  // and the metrics are those of one rank routing every token.
  const detail::RoutingTotals tot = detail::routing_totals(local, int(rows), E, n, seq_);
  const std::vector<double>& count = tot.count;
  const double nk = tot.tokens * k;
  s.tokens = tot.tokens;
  // The auxiliary load-balancing loss (before any drop: what the router asked for).
  s.f.assign(static_cast<std::size_t>(E), 0.f);
  s.aux = 0;
  for (int e = 0; e < E; ++e) {
    s.f[e] = static_cast<float>(count[e] / nk);
    s.aux += double(E) * s.f[e] * (tot.prob[e] / tot.tokens);
  }
  // Capacity: assignments beyond it, in the whole micro-batch's token order, are dropped.
  const double cap = capped ? std::ceil(spec_.capacity_factor * nk / double(E)) : HUGE_VAL;
  std::vector<std::size_t> kept(static_cast<std::size_t>(E), 0);
  std::vector<double> seen(static_cast<std::size_t>(E), 0.0);  // assignments to e before this one
  s.row.assign(s.expert.size(), 0);  // 0: kept (a row is assigned below), -1: dropped
  for (std::size_t a = 0; a < s.expert.size(); ++a) {
    const std::int64_t t = static_cast<std::int64_t>(a) / k;
    if (a % k == 0 && t % per_row == 0)
      std::copy_n(tot.before.begin() + (t / per_row) * E, E, seen.begin());
    const int e = s.expert[a];
    if (seen[e]++ >= cap) s.row[a] = -1;
    else ++kept[e];
  }
  if (call.train() && !call.replay()) {
    double dropped = 0;
    for (int e = 0; e < E; ++e) dropped += std::max(0.0, count[e] - cap);
    const double mx = *std::max_element(count.begin(), count.end());
    group_.shared->record(full_name_.empty() ? name_ : full_name_, s.aux, mx * E / nk, dropped, nk, count);
    if (bias_.defined()) {
      std::lock_guard<std::mutex> lock(load_mu_);
      load_.resize(static_cast<std::size_t>(E), 0.0);
      for (int e = 0; e < E; ++e) load_[e] += count[e];
    }
  }
  // Dispatch: rows grouped by global expert (= by owner rank, then local expert).
  std::vector<std::size_t> offset(static_cast<std::size_t>(E), 0);
  for (int e = 1; e < E; ++e) offset[e] = offset[e - 1] + kept[e - 1];
  const std::size_t rows_out = offset[E - 1] + kept[E - 1];
  s.send.resize(rows_out * std::size_t(D));
  for (std::size_t a = 0; a < s.expert.size(); ++a)
    if (s.row[a] >= 0) s.row[a] = static_cast<std::int64_t>(offset[s.expert[a]]++);
  s.send_counts = kept;
  s.recv_counts = detail::exchange_expert_counts(group_, kept, L);  // the counts first: one small all-to-all
  detail::expert_layout(s, p, L, group_.rank);
}

void MoeMlp::expert_forward(Saved& s, const std::vector<std::int64_t>& first, const std::vector<std::int64_t>& count,
                            detail::RowExchange* ex) const {
  if (s.perm.empty()) return;
  const std::int64_t D = spec_.dim, H = spec_.hidden, M = s.stride;
  const int L = local_experts();
  float *xe = s.xe.data<float>(), *h = s.h.data<float>(), *oe = s.oe.data();
  const float* w1 = arena_->param(w1_[0]).data<float>();
  const float* w2 = arena_->param(w2_[0]).data<float>();
  const bool whole = count == s.rows;  // first is zero then: one call over the blocks
  auto gemm = [&](const detail::GroupedGemm& g) {
    whole ? s.gemm->run(g, s.rows, false) : s.gemm->run_rows(g, first, count);
    if (ex) ex->progress();
  };
  gemm({false, true, M, H, D, xe, D, M * D, w1, D, wstride_, h, H, M * H});
  for (int l = 0; l < L; ++l) add_bias(h + (l * M + first[l]) * H, arena_->param(b1_[l]).data<float>(), count[l], H);
  gelu_rows(s, first, count, whole, true);
  gemm({false, true, M, D, H, s.a.data<float>(), H, M * H, w2, H, wstride_, oe, D, M * D});
  for (int l = 0; l < L; ++l) add_bias(oe + (l * M + first[l]) * D, arena_->param(b2_[l]).data<float>(), count[l], D);
}

// GELU (forward: a = gelu(h); backward: dh from da) on the rows a pass
// computes. Whole: one call over every block. Else per expert, in spans of at
// most 64 rows aligned to 8 within the block (oneDNN's eltwise plans are per
// size: a handful of sizes, not one per row count); the few rows a span takes
// beyond the pass's are recomputed from the same values, or overwritten by the
// other pass, or padding (zero in h).
void MoeMlp::gelu_rows(Saved& s, const std::vector<std::int64_t>& first, const std::vector<std::int64_t>& count,
                       bool whole, bool forward) const {
  if (whole) {
    forward ? gelu_->forward(s.h, s.a) : gelu_->backward(s.h, s.a, s.da, s.dh);
    return;
  }
  const std::int64_t H = spec_.hidden, M = s.stride;
  for (std::size_t l = 0; l < count.size(); ++l) {
    if (count[l] == 0) continue;
    const std::int64_t lo = first[l] / 8 * 8, hi = std::min(M, (first[l] + count[l] + 7) / 8 * 8);
    for (std::int64_t r = lo; r < hi; r += 64) {
      const std::int64_t off = (std::int64_t(l) * M + r) * H, n = std::min<std::int64_t>(64, hi - r) * H;
      Tensor h = s.h.flat_view(off, n), a = s.a.flat_view(off, n);
      if (forward) {
        gelu_->forward(h, a);
      } else {
        Tensor da = s.da.flat_view(off, n), dh = s.dh.flat_view(off, n);
        gelu_->backward(h, a, da, dh);
      }
    }
  }
}

void MoeMlp::expert_backward_rows(Saved& s, const std::vector<std::int64_t>& first,
                                  const std::vector<std::int64_t>& count, detail::RowExchange* ex) const {
  if (s.perm.empty()) return;
  const std::int64_t D = spec_.dim, H = spec_.hidden, M = s.stride;
  const int L = local_experts();
  float* da = s.da.data<float>();
  const float* w1 = arena_->param(w1_[0]).data<float>();
  const float* w2 = arena_->param(w2_[0]).data<float>();
  const bool whole = count == s.rows;
  auto gemm = [&](const detail::GroupedGemm& g) {
    whole ? s.gemm->run(g, s.rows, false) : s.gemm->run_rows(g, first, count);
    if (ex) ex->progress();
  };
  // da = doe W2, (GELU), dxe = dh W1: per row.
  gemm({false, false, M, H, D, s.doe.data(), D, M * D, w2, H, wstride_, da, H, M * H});
  // Pad rows of da (and so dh) stay zero for the grouped mode's weight gradients (doe's are).
  for (int l = 0; l < L; ++l) std::fill(da + (l * M + s.rows[l]) * H, da + (l + 1) * M * H, 0.f);
  gelu_rows(s, first, count, whole, false);
  gemm({false, false, M, D, H, s.dh.data<float>(), H, M * H, w1, D, wstride_, s.dxe.data(), D, M * D});
}

Tensor MoeMlp::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  Saved& s = saved<Saved>(c);
  if (!dy.device().is_cpu() || spec_.device_path) return device_backward(dy, s, need_dx, accumulate);
  const std::int64_t D = spec_.dim, H = spec_.hidden, n = s.x.numel() / D;
  const int E = spec_.experts, k = spec_.top_k, L = local_experts();
  // Sequence parallelism: this shard's gradients go to partial_, then summed over seq_ into the arena.
  const bool acc = seq_.size == 1 && accumulate;
  // Combine backward: d gate and d expert output.
  std::vector<float>&dgate = s.dgate, &dout_send = s.dout_send;
  dgate.assign(s.gate.size(), 0.f);
  dout_send.resize(s.out_send.size());
  const Tensor row = host(s.row, {n * k}), gate = host(s.gate, {n * k});
  {
    const std::int64_t R = std::int64_t(s.out_send.size()) / D;
    Tensor dg = host(dgate, {n * k}), drows = host(dout_send, {R, D});
    be_->moe_combine_backward(dy, host(s.out_send, {R, D}), row, gate, k, dg, drows);
  }
  // Expert side: the own rows' per-row backward while the others' gradients travel.
  const int p = group_.size;
  const bool overlap = spec_.overlap && p > 1, split = overlap && spec_.gemm != ExpertGemmMode::dnnl_grouped;
  detail::RowExchange ex(group_, L, D);
  ex.start(s, dout_send, s.dout_recv, true, overlap);
  const auto R = static_cast<std::int64_t>(s.perm.size());
  const std::int64_t M = s.stride;
  std::vector<float>&doe = s.doe, &dxe = s.dxe;
  doe.assign(static_cast<std::size_t>(L * M * D), 0.f);  // pad rows zero: they add nothing to the weight gradients
  dxe.resize(static_cast<std::size_t>(L * M * D));
  if (R > 0) {
    ensure(s.da, {L * M, H}, DType::f32, Device::cpu());
    ensure(s.dh, {L * M, H}, DType::f32, Device::cpu());
  }
  const detail::RowSplit rs = detail::row_split(s, p, L, group_.rank);
  auto gather = [&](int which) {  // 0: own rows, 1: the others', 2: all
    for (std::int64_t i = 0; i < R; ++i)
      if (which == 2 || rs.is_own(s.perm[i]) == (which == 0))
        std::memcpy(doe.data() + s.slot[i] * D, &s.dout_recv[s.perm[i] * D], sizeof(float) * D);
  };
  if (split) {
    gather(0);
    expert_backward_rows(s, rs.zero, s.own, &ex);
    ex.wait_received();
    gather(1);
    expert_backward_rows(s, s.own, rs.remote, nullptr);
  } else {
    ex.wait();
    gather(2);
    expert_backward_rows(s, rs.zero, s.rows, nullptr);
  }
  s.dx_recv.resize(s.recv.size());
  for (std::int64_t i = 0; i < R; ++i)
    std::memcpy(&s.dx_recv[s.perm[i] * D], dxe.data() + s.slot[i] * D, sizeof(float) * D);
  // The input gradients go back while the weight gradients and the router's backward run.
  std::vector<float>& dx_send = s.dx_send;
  ex.start(s, s.dx_recv, dx_send, false, overlap);
  // Weight gradients are sums over every rank's tokens: 1/EP makes the
  // expert-data group's average the mean over all data-parallel ranks.
  const float alpha = 1.f / float(p);
  if (R > 0) {
    float* dw1 = grad_ptr(w1_[0]);
    float* dw2 = grad_ptr(w2_[0]);
    float* dh = s.dh.data<float>();
    detail::ExpertGemm& g = *s.gemm;
    // dW2 = alpha doe^T a, dW1 = alpha dh^T xe: per expert, over all its rows in one call.
    g.run({true, false, D, H, M, doe.data(), D, M * D, s.a.data<float>(), H, M * H, dw2, H, wstride_, alpha, acc},
          s.rows, true);
    g.run({true, false, H, D, M, dh, H, M * H, s.xe.data<float>(), D, M * D, dw1, D, wstride_, alpha, acc}, s.rows,
          true);
    for (int l = 0; l < L; ++l) {
      sum_rows(doe.data() + l * M * D, s.rows[l], D, alpha, grad_ptr(b2_[l]), acc);
      sum_rows(dh + l * M * H, s.rows[l], H, alpha, grad_ptr(b1_[l]), acc);
    }
  } else {
    for (int l = 0; l < L; ++l)
      for (std::size_t q : {w1_[l], b1_[l], w2_[l], b2_[l]})
        if (!acc) std::fill_n(grad_ptr(q), arena_->grad(q).numel(), 0.f);
  }
  // Router: gates -> probabilities (+ the aux loss) -> softmax -> logits.
  const double aux_g = spec_.aux_loss_coeff * group_.shared->grad_scale * double(E) / s.tokens;
  std::vector<float>& dlogit = s.dlogit;
  dlogit.resize(static_cast<std::size_t>(n * E));
  {
    Tensor dl = host(dlogit, {n, E});
    be_->moe_router_backward(host(s.probs, {n, E}), host(s.expert, {n, k}), gate, host(dgate, {n * k}),
                             host(s.f, {E}), aux_g, dl);
  }
  const float* xp = s.x.data<float>();
  be_->batched_gemm(Device::cpu(),
                    {true, false, E, D, n, 1.f, dlogit.data(), E, 0, xp, D, 0, acc ? 1.f : 0.f, grad_ptr(router_), D, 0, 1});
  if (seq_.size > 1) {
    const Tensor span = arena_->grads_flat(DType::f32).flat_view(grad_lo_, partial_.numel());
    tp_sum_partial(partial_, {span}, accumulate, seq_, *be_);
  }
  if (need_dx) {
    ensure(s.dx, s.x.shape(), DType::f32, Device::cpu());
    be_->batched_gemm(Device::cpu(), {false, false, n, D, E, 1.f, dlogit.data(), E, 0,
                                      arena_->param(router_).data<float>(), D, 0, 0.f, s.dx.data<float>(), D, 0, 1});
  }
  ex.wait();
  if (!need_dx) return {};
  // dx[t] += the gradient of each kept assignment's row, in j order (a combine with gates of 1).
  be_->moe_combine(host(dx_send, {std::int64_t(dx_send.size()) / D, D}), row, Tensor(), k, Tensor(), s.dx, true);
  return s.dx;
}

const char* expert_gemm_name(ExpertGemmMode m) {
  switch (m) {
    case ExpertGemmMode::dnnl_grouped: return "oneDNN batched matmul over the experts (padded)";
    case ExpertGemmMode::blas_loop: return "OpenBLAS sgemm per expert";
    case ExpertGemmMode::dnnl_loop: return "oneDNN matmul per expert";
  }
  return "?";
}

LayerPtr moe_mlp(const MoeSpec& s, const ExpertGroup& g) { return std::make_unique<MoeMlp>("moe", s, g); }

}  // namespace ringtrain
