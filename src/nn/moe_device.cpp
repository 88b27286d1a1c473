// MoeMlp (nn/moe.hpp) on a device (CUDA): the host path's steps through
// Backend ops on device tensors. What stays on the host is the bookkeeping of
// n k indices (plan_dispatch: the routing totals, the aux loss, the capacity's
// drops, each assignment's row, the exchange's counts): the router's top-k
// experts (n k ints) and probability sums (E doubles) come to the host once
// per forward, the row indices go back. The experts' GEMMs are one strided
// batched call per matrix over the padded blocks (Backend::batched_gemm), the
// exchanges at parallel.expert > 1 blocking and staged through host copies
// (Open MPI here is not CUDA-aware; as nn/ulysses_attention.cpp stages):
// no overlap on the device yet. Sequence parallelism is refused at bind.
#include <cstring>

#include "moe_dispatch.hpp"
#include "ringtrain/core/allocator.hpp"
#include "ringtrain/nn/moe.hpp"

namespace ringtrain {
namespace detail {

// The device path's tensors of one micro-batch (MoeMlp::Saved::dev).
struct MoeDeviceSaved {
  Tensor probs, expert, gate, psum, bias, f;                  // router
  Tensor row, send_idx, xe_idx, back_idx;                     // i64 index lists (nn/moe.hpp's Saved)
  Tensor send, recv, xe, h, a, oe, out_recv, out_send, y;     // forward rows
  Tensor dgate, dout_send, dout_recv, doe, da, dh, dxe, dx_recv, dx_send, dlogit, dx, ones;
  std::int64_t R = 0;  // rows received (expert side)
};

}  // namespace detail

namespace {

using detail::MoeDeviceSaved;

Tensor& ensure_on(Tensor& t, const Shape& shape, DType dt, Device dev) {
  if (!t.defined() || t.shape() != shape || t.dtype() != dt || t.device() != dev) t = Tensor::empty(shape, dt, dev);
  return t;
}

template <class T>
void upload(Tensor& dst, const std::vector<T>& v, Device dev) {
  ensure_on(dst, {std::int64_t(v.size())}, dtype_of<T>::value, dev);
  if (!v.empty()) copy_bytes(dst.raw(), dev, v.data(), Device::cpu(), v.size() * sizeof(T));
}

template <class T>
void download(std::vector<T>& v, const Tensor& src) {
  v.resize(static_cast<std::size_t>(src.numel()));
  if (!v.empty()) copy_bytes(v.data(), Device::cpu(), src.raw(), src.device(), v.size() * sizeof(T));
}

}  // namespace

Tensor MoeMlp::device_forward(const Tensor& x, Saved& s, const Call& call) const {
  const Device dev = x.device();
  const std::int64_t D = spec_.dim, H = spec_.hidden, n = x.numel() / D;
  const int E = spec_.experts, k = spec_.top_k, L = local_experts();
  if (!s.dev) s.dev = std::make_shared<MoeDeviceSaved>();
  MoeDeviceSaved& d = *s.dev;
  s.x = x;
  const Tensor x2 = x.reshape({n, D});
  // Router: logits, then softmax, top-k and gates on the device (Backend::moe_route).
  ensure_on(d.probs, {n, E}, DType::f32, dev);
  be_->batched_gemm(dev, {false, true, n, E, D, 1.f, x.device_data<float>(), D, 0,
                          arena_->param(router_).device_data<float>(), D, 0, 0.f, d.probs.device_data<float>(), E, 0,
                          1});
  ensure_on(d.expert, {n, k}, DType::i32, dev);
  ensure_on(d.gate, {n, k}, DType::f32, dev);
  ensure_on(d.psum, {E}, DType::f64, dev);
  if (bias_.defined()) {  // the selection bias lives on the host (update_bias); E floats go over
    ensure_on(d.bias, {E}, DType::f32, dev);
    copy_bytes(d.bias.raw(), dev, bias_.raw(), Device::cpu(), bias_.nbytes());
  }
  be_->moe_route(d.probs, bias_.defined() ? d.bias : Tensor(), k, d.expert, d.gate, d.psum);
  be_->synchronize();
  download(s.expert, d.expert);
  std::vector<double> psum;
  download(psum, d.psum);
  plan_dispatch(s, x, psum.data(), call);  // s.row, the counts and the expert-side layout
  // Dispatch: send row r is token a / k of its assignment a.
  const std::int64_t rows_out = std::int64_t(s.send.size()) / D;
  std::vector<std::int64_t> idx(static_cast<std::size_t>(rows_out), -1);
  for (std::size_t a = 0; a < s.row.size(); ++a)
    if (s.row[a] >= 0) idx[std::size_t(s.row[a])] = std::int64_t(a) / k;
  upload(d.send_idx, idx, dev);
  upload(d.row, s.row, dev);
  ensure_on(d.send, {rows_out, D}, DType::f32, dev);
  be_->moe_gather_rows(x2, d.send_idx, d.send);
  device_exchange(s, d.send, d.recv, s.send, s.recv, true);
  // Expert side: block row slot[i] <- received row perm[i] (pads: -1, zero rows); and back.
  const auto R = static_cast<std::int64_t>(s.perm.size());
  const std::int64_t M = s.stride;
  d.R = R;
  ensure_on(d.out_recv, {R, D}, DType::f32, dev);
  if (R > 0) {
    std::vector<std::int64_t> xi(static_cast<std::size_t>(L * M), -1), bi(static_cast<std::size_t>(R));
    for (std::int64_t i = 0; i < R; ++i) xi[std::size_t(s.slot[i])] = s.perm[i], bi[std::size_t(s.perm[i])] = s.slot[i];
    upload(d.xe_idx, xi, dev);
    upload(d.back_idx, bi, dev);
    ensure_on(d.xe, {L * M, D}, DType::f32, dev);
    ensure_on(d.h, {L * M, H}, DType::f32, dev);
    ensure_on(d.a, {L * M, H}, DType::f32, dev);
    ensure_on(d.oe, {L * M, D}, DType::f32, dev);
    be_->moe_gather_rows(d.recv, d.xe_idx, d.xe);
    // Whole padded blocks: the pad rows of xe are zero, so (biases added to the
    // experts' rows only) they stay zero in h, a and oe.
    const float* w1 = arena_->param(w1_[0]).device_data<float>();
    const float* w2 = arena_->param(w2_[0]).device_data<float>();
    be_->batched_gemm(dev, {false, true, M, H, D, 1.f, d.xe.device_data<float>(), D, M * D, w1, D, wstride_, 0.f,
                            d.h.device_data<float>(), H, M * H, L});
    for (int l = 0; l < L; ++l)
      if (s.rows[l] > 0) {
        Tensor v = d.h.flat_view(l * M * H, s.rows[l] * H);
        be_->add_broadcast(v, arena_->param(b1_[l]), 1, v);
      }
    gelu_->forward(d.h, d.a);
    be_->batched_gemm(dev, {false, true, M, D, H, 1.f, d.a.device_data<float>(), H, M * H, w2, H, wstride_, 0.f,
                            d.oe.device_data<float>(), D, M * D, L});
    for (int l = 0; l < L; ++l)
      if (s.rows[l] > 0) {
        Tensor v = d.oe.flat_view(l * M * D, s.rows[l] * D);
        be_->add_broadcast(v, arena_->param(b2_[l]), 1, v);
      }
    be_->moe_gather_rows(d.oe, d.back_idx, d.out_recv);
  }
  device_exchange(s, d.out_recv, d.out_send, s.out_recv, s.out_send, false);
  // Combine: y[t] = sum_j gate_j * expert output, in j order.
  ensure_on(d.y, x.shape(), DType::f32, dev);
  be_->moe_combine(d.out_send, d.row, d.gate, k, Tensor(), d.y, false);
  return d.y;
}

Tensor MoeMlp::device_backward(const Tensor& dy, Saved& s, bool need_dx, bool accumulate) const {
  RT_CHECK(s.dev, "MoE layer '", name_, "': device backward without its forward");
  MoeDeviceSaved& d = *s.dev;
  const Device dev = dy.device();
  const std::int64_t D = spec_.dim, H = spec_.hidden, n = s.x.numel() / D, R = d.R, M = s.stride;
  const int E = spec_.experts, k = spec_.top_k, L = local_experts(), p = group_.size;
  const bool acc = accumulate;  // sequence parallelism is refused on the device (bind)
  const float beta = acc ? 1.f : 0.f;
  auto grad = [&](std::size_t q) { return arena_->grad(q).device_data<float>(); };
  // Combine backward: d gate and d expert output.
  ensure_on(d.dgate, {n * k}, DType::f32, dev);
  ensure_on(d.dout_send, d.out_send.shape(), DType::f32, dev);
  be_->moe_combine_backward(dy, d.out_send, d.row, d.gate, k, d.dgate, d.dout_send);
  device_exchange(s, d.dout_send, d.dout_recv, s.dout_send, s.dout_recv, true);
  ensure_on(d.dx_recv, {R, D}, DType::f32, dev);
  // Weight gradients are sums over every rank's tokens: 1/EP (nn/moe.cpp says why).
  const float alpha = 1.f / float(p);
  if (R > 0) {
    ensure_on(d.doe, {L * M, D}, DType::f32, dev);
    ensure_on(d.da, {L * M, H}, DType::f32, dev);
    ensure_on(d.dh, {L * M, H}, DType::f32, dev);
    ensure_on(d.dxe, {L * M, D}, DType::f32, dev);
    be_->moe_gather_rows(d.dout_recv, d.xe_idx, d.doe);  // pad rows zero: nothing to the weight gradients
    const float* w1 = arena_->param(w1_[0]).device_data<float>();
    const float* w2 = arena_->param(w2_[0]).device_data<float>();
    float *doe = d.doe.device_data<float>(), *dh = d.dh.device_data<float>();
    be_->batched_gemm(dev, {false, false, M, H, D, 1.f, doe, D, M * D, w2, H, wstride_, 0.f,
                            d.da.device_data<float>(), H, M * H, L});
    gelu_->backward(d.h, d.a, d.da, d.dh);
    be_->batched_gemm(dev, {false, false, M, D, H, 1.f, dh, H, M * H, w1, D, wstride_, 0.f,
                            d.dxe.device_data<float>(), D, M * D, L});
    be_->moe_gather_rows(d.dxe, d.back_idx, d.dx_recv);
    // dW2 = alpha doe^T a, dW1 = alpha dh^T xe over the padded blocks; the
    // biases' as ones^T doe (dh): GEMMs too, so one reduction order throughout.
    be_->batched_gemm(dev, {true, false, D, H, M, alpha, doe, D, M * D, d.a.device_data<float>(), H, M * H, beta,
                            grad(w2_[0]), H, wstride_, L});
    be_->batched_gemm(dev, {true, false, H, D, M, alpha, dh, H, M * H, d.xe.device_data<float>(), D, M * D, beta,
                            grad(w1_[0]), D, wstride_, L});
    if (d.ones.numel() != M) upload(d.ones, std::vector<float>(static_cast<std::size_t>(M), 1.f), dev);
    for (int l = 0; l < L; ++l) {
      be_->batched_gemm(dev, {false, false, 1, D, M, alpha, d.ones.device_data<float>(), M, 0, doe + l * M * D, D, 0,
                              beta, grad(b2_[l]), D, 0, 1});
      be_->batched_gemm(dev, {false, false, 1, H, M, alpha, d.ones.device_data<float>(), M, 0, dh + l * M * H, H, 0,
                              beta, grad(b1_[l]), H, 0, 1});
    }
  } else if (!acc) {
    for (int l = 0; l < L; ++l)
      for (std::size_t q : {w1_[l], b1_[l], w2_[l], b2_[l]}) arena_->grad(q).zero_();
  }
  device_exchange(s, d.dx_recv, d.dx_send, s.dx_recv, s.dx_send, false);
  // Router: gates -> probabilities (+ the aux loss) -> softmax -> logits.
  const double aux_g = spec_.aux_loss_coeff * group_.shared->grad_scale * double(E) / s.tokens;
  upload(d.f, s.f, dev);
  ensure_on(d.dlogit, {n, E}, DType::f32, dev);
  be_->moe_router_backward(d.probs, d.expert, d.gate, d.dgate.reshape({n, k}), d.f, aux_g, d.dlogit);
  be_->batched_gemm(dev, {true, false, E, D, n, 1.f, d.dlogit.device_data<float>(), E, 0,
                          s.x.device_data<float>(), D, 0, beta, grad(router_), D, 0, 1});
  if (!need_dx) return {};
  ensure_on(d.dx, s.x.shape(), DType::f32, dev);
  be_->batched_gemm(dev, {false, false, n, D, E, 1.f, d.dlogit.device_data<float>(), E, 0,
                          arena_->param(router_).device_data<float>(), D, 0, 0.f, d.dx.device_data<float>(), D, 0, 1});
  // dx[t] += the gradient of each kept assignment's row, in j order.
  be_->moe_combine(d.dx_send, d.row, Tensor(), k, Tensor(), d.dx, true);
  return d.dx;
}

// Rows between the token side and the expert side: at one rank the same rows
// (aliased); else through host copies and the host's blocking exchange
// (detail::RowExchange: the counts of plan_dispatch, bounded waits).
void MoeMlp::device_exchange(Saved& s, const Tensor& in, Tensor& out, std::vector<float>& host_in,
                             std::vector<float>& host_out, bool forward_dir) const {
  if (group_.size == 1) {
    out = in;
    return;
  }
  const std::int64_t D = spec_.dim;
  be_->synchronize();
  download(host_in, in);
  detail::RowExchange ex(group_, local_experts(), D);
  ex.start(s, host_in, host_out, forward_dir, false);
  ex.wait();
  ensure_on(out, {std::int64_t(host_out.size()) / D, D}, DType::f32, in.device());
  if (!host_out.empty()) copy_bytes(out.raw(), out.device(), host_out.data(), Device::cpu(), host_out.size() * 4);
}

}  // namespace ringtrain
