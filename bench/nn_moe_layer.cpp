// MoE layer (nn/moe.hpp) throughput against the dense MLP with the same
// active FLOPs, and the all-to-all payload of expert parallelism against its
// formula, measured in the same run.
//
//  - Reference: the dense MLP fc2(gelu(fc1(x))) with hidden = top_k x H (what
//    one token computes in the MoE layer: k experts of hidden H), Linear
//    layers on oneDNN. Figure: MoE forward+backward time / dense time (the
//    issue's goal: <= 1.2). The MoE time includes routing, the gather/scatter
//    of rows and (at EP > 1) the all-to-alls.
//  - Bytes: what one rank hands to alltoallv for other ranks in one layer's
//    forward (dispatch + combine), from the layer's own counts, beside
//    2 * T * k * h * b * (EP - 1) / EP (T tokens per rank, h = model width,
//    b = 4 bytes): equal in expectation under uniform routing.
//  - The experts' GEMMs three ways (MoeSpec::gemm, src/nn/moe_gemm.hpp): one
//    oneDNN matmul batched over the experts (rows padded to the busiest
//    expert's), one OpenBLAS sgemm per expert, one oneDNN matmul per expert;
//    each against the same dense reference. --skew s adds s times one fixed
//    random direction to every token, so the router prefers some experts
//    (max/mean tokens per expert > 1: what the padding costs).
//  - At EP > 1, the share of the layer's forward+backward spent blocked in
//    its all-to-alls (counts and rows, both directions: the exposed time) and
//    in flight, for every variant; the default (oneDNN per expert) runs twice,
//    with the exchanges overlapped with expert compute (MoeSpec::overlap, the
//    default) and blocking (the reference), interleaved in the same run.
//   mpirun -np 2 bench_nn_moe_layer --tokens 2048 --dim 256 --hidden 512 --experts 8 --top-k 2 --ep 2
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/moe.hpp"

using namespace ringtrain;

namespace {

struct Bound {
  ParamArena arena;
  std::vector<LayerPtr> layers;
  void bind(std::uint64_t seed) {
    for (auto& l : layers) l->register_params(arena, 0, "");
    arena.finalize();
    for (auto& l : layers) l->bind(BindContext{backend_for(DeviceKind::cpu), Device::cpu(), arena, seed});
    for (auto& l : layers) l->init(arena, seed);
  }
  void step(const Tensor& x, const Tensor& dy) {
    Tensor h = x;
    for (auto& l : layers) h = l->forward(h, Mode::train);
    Tensor d = dy;
    for (std::size_t i = layers.size(); i-- > 0;) d = layers[i]->backward(d, true, false);
  }
};

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  CLI::App app{"MoE layer vs the dense MLP of the same active FLOPs; all-to-all bytes per rank"};
  std::int64_t tokens = 2048, dim = 256, hidden = 512;
  int experts = 8, top_k = 2, ep = 1, iters = 10;
  double skew = 0;
  app.add_option("--tokens", tokens, "tokens per rank (T)");
  app.add_option("--dim", dim, "model width (h)");
  app.add_option("--hidden", hidden, "expert hidden units (H)");
  app.add_option("--experts", experts, "experts (E)");
  app.add_option("--top-k", top_k, "experts per token (k)");
  app.add_option("--ep", ep, "expert-parallel ranks (the world)");
  app.add_option("--iters", iters, "timed iterations (median)");
  app.add_option("--skew", skew, "add skew * a fixed random direction to every token (uneven routing)");
  CLI11_PARSE(app, argc, argv);
  Communicator world = Communicator::world();
  RT_CHECK(world.size() == ep, "run with mpirun -np ", ep, " (--ep)");
  ExpertGroup g;
  g.comm = world;
  g.size = ep;
  g.rank = world.rank();
  MoeSpec s;
  s.dim = dim;
  s.hidden = hidden;
  s.experts = experts;
  s.top_k = top_k;
  // The last: the default (oneDNN per expert) with blocking exchanges, the
  // reference of the overlap (MoeSpec::overlap).
  const ExpertGemmMode modes[] = {ExpertGemmMode::dnnl_grouped, ExpertGemmMode::blas_loop, ExpertGemmMode::dnnl_loop,
                                  ExpertGemmMode::dnnl_loop};
  constexpr int kModes = 4, kBlocking = 3, kDefault = 2;
  Bound moes[kModes], dense;
  for (int m = 0; m < kModes; ++m) {
    s.gemm = modes[m];
    s.overlap = m != kBlocking;
    moes[m].layers.push_back(std::make_unique<MoeMlp>("moe", s, g));
    moes[m].bind(7);
  }
  dense.layers.push_back(std::make_unique<Linear>("fc1", LinearSpec{dim, top_k * hidden, true, false}));
  dense.layers.push_back(std::make_unique<Activation>("gelu", Eltwise::gelu));
  dense.layers.push_back(std::make_unique<Linear>("fc2", LinearSpec{top_k * hidden, dim, true, false}));
  dense.bind(7);
  Tensor x = Tensor::empty({1, tokens, dim}), dy = Tensor::empty({1, tokens, dim});
  std::mt19937 rng(1 + world.rank());
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> dir(static_cast<std::size_t>(dim));
  std::mt19937 shared_rng(99);  // the same direction on every rank
  for (auto& v : dir) v = nd(shared_rng);
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = nd(rng) + float(skew) * dir[i % dim], dy.data<float>()[i] = nd(rng) * 1e-3f;
  std::vector<double> tm[kModes], td, exposed[kModes], span[kModes], counts[kModes];
  MoeShared& sh = *g.shared;
  for (int i = 0; i < iters + 2; ++i) {  // interleaved, 2 warm-ups
    for (int which = 0; which <= kModes; ++which) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double w0 = sh.alltoall_wait_s, s0 = sh.alltoall_span_s, c0 = sh.alltoall_counts_s;
      const auto t0 = std::chrono::steady_clock::now();
      (which == kModes ? dense : moes[which]).step(x, dy);
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // This rank's shares of the step: blocked in the exchanges, and in flight.
      double share[3] = {(sh.alltoall_wait_s - w0) / t, (sh.alltoall_span_s - s0) / t,
                         (sh.alltoall_counts_s - c0) / t};
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, share, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (i < 2) continue;
      (which == kModes ? td : tm[which]).push_back(t);
      if (which < kModes)
        exposed[which].push_back(share[0]), span[which].push_back(share[1]), counts[which].push_back(share[2]);
    }
  }
  // The three modes compute the same function: their outputs agree to rounding.
  auto out = [&](int m) { return dynamic_cast<SavedCtx<MoeMlp::Saved>&>(moes[m].layers[0]->own_ctx()).s.y; };
  double diff = 0, norm = 0;
  for (int m = 1; m < kModes; ++m)
    for (std::int64_t i = 0; i < out(0).numel(); ++i) {
      diff = std::max(diff, double(std::fabs(out(m).data<float>()[i] - out(0).data<float>()[i])));
      norm = std::max(norm, double(std::fabs(out(0).data<float>()[i])));
    }
  // Overlapped against blocking (the same GEMMs, rows split in two passes):
  // outputs and input gradients, the largest difference on any rank.
  auto dxo = [&](int m) { return dynamic_cast<SavedCtx<MoeMlp::Saved>&>(moes[m].layers[0]->own_ctx()).s.dx; };
  double split_diff[2] = {0, 0};
  for (std::int64_t i = 0; i < out(0).numel(); ++i) {
    split_diff[0] = std::max(split_diff[0], double(std::fabs(out(kDefault).data<float>()[i] - out(kBlocking).data<float>()[i])));
    split_diff[1] = std::max(split_diff[1], double(std::fabs(dxo(kDefault).data<float>()[i] - dxo(kBlocking).data<float>()[i])));
  }
  MPI_Allreduce(MPI_IN_PLACE, split_diff, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  // Bytes to other ranks in one forward: dispatch rows + the combine's rows back.
  auto& sv = dynamic_cast<SavedCtx<MoeMlp::Saved>&>(moes[0].layers[0]->own_ctx()).s;
  double rows_max = 0, rows_sum = 0;  // this rank's experts' rows: max/mean (the padding of the grouped call)
  for (auto r : sv.rows) rows_max = std::max(rows_max, double(r)), rows_sum += double(r);
  const int L = experts / ep;
  double rows_out = 0, rows_in = 0;
  for (int e = 0; e < experts; ++e)
    if (e / L != world.rank()) rows_out += double(sv.send_counts[e]), rows_in += double(sv.recv_counts[e]);
  const double bytes = (rows_out + rows_in) * double(dim) * 4;
  const double formula = 2.0 * double(tokens) * top_k * double(dim) * 4 * (ep - 1) / ep;
  double worst = 0, sum = 0;
  MPI_Allreduce(&bytes, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&bytes, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (world.rank() == 0) {
    const double fd = median(td);
    const double flops = 3 * 2.0 * double(tokens) * top_k * 2 * double(dim) * double(hidden);  // fwd + bwd, experts
    std::printf("MoE layer: T=%lld tokens/rank, h=%lld, H=%lld, E=%d, k=%d, EP=%d, skew %.2f, %d iterations (median, slowest rank)\n",
                (long long)tokens, (long long)dim, (long long)hidden, experts, top_k, ep, skew, iters);
    std::printf("  dense MLP (hidden k*H = %lld): %8.3f ms  %6.2f GFLOP/s  (reference)\n", (long long)(top_k * hidden),
                1e3 * fd, flops / fd / 1e9);
    for (int m = 0; m < kModes; ++m) {
      const double fm = median(tm[m]);
      std::printf("  MoE, %-48s: %8.3f ms  %6.2f GFLOP/s  time ratio MoE/dense %.3f (goal <= 1.2)\n",
                  cat(expert_gemm_name(modes[m]), m == kBlocking ? ", blocking" : "").c_str(), 1e3 * fm,
                  flops / fm / 1e9, fm / fd);
    }
    std::printf("  rank 0's experts: max/mean rows %.3f (the grouped call pads to the max); outputs of the three "
                "agree within %.2e of max |y| %.3f\n", rows_max * double(sv.rows.size()) / rows_sum, diff, norm);
    std::printf("  aux loss of the last forward %.4f (1 = balanced)\n", sv.aux);
    if (ep > 1)
      std::printf("  all-to-all bytes per rank per layer forward: mean %.0f, max %.0f; formula 2*T*k*h*b*(EP-1)/EP = %.0f;"
                  " mean/formula %.3f (goal within 5%%)\n",
                  sum / ep, worst, formula, sum / ep / formula);
    if (ep > 1) {
      std::printf("  all-to-alls, share of the MoE layer's forward+backward (median; the busiest rank per iteration):"
                  " exposed (blocked in the exchanges' calls; of it, in the counts' all-to-all) / in flight (start"
                  " until the rows received are here); goal exposed <= 0.15\n");
      for (int m = 0; m < kModes; ++m)
        std::printf("    %-56s exposed %.3f (counts %.3f)  in flight %.3f\n",
                    cat(expert_gemm_name(modes[m]), m == kBlocking ? ", blocking" : ", overlapped").c_str(),
                    median(exposed[m]), median(counts[m]), median(span[m]));
      const double fo = median(tm[kDefault]), fb = median(tm[kBlocking]);
      std::printf("  overlapped / blocking (oneDNN per expert): step time %.3f, exposed share %.3f; outputs differ by "
                  "%.2e, input gradients by %.2e at most (the GEMMs' row split)\n",
                  fo / fb, median(exposed[kDefault]) / median(exposed[kBlocking]), split_diff[0], split_diff[1]);
    }
  }
  MPI_Finalize();
  return 0;
}
