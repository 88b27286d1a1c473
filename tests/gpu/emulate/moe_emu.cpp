// tests/gpu/emulate/run.sh: the kernels of cuda/kernels/moe.cu on the CPU
// (emu.hpp) against the CPU backend itself (backend_for(cpu): the loops of
// src/backend/cpu/moe_ops.cpp, linked from the build), on the same inputs:
//  - the router: the same top-k experts (ties among equal logits and a
//    selection bias included), probabilities, gates and probability sums;
//  - the row gather (pads of -1 included): bitwise;
//  - the gated combine (all tokens; a token list; accumulating, gates of 1);
//  - the combine's backward (d gate, d rows) and the router's (d logits).
// Exits 1 when a bound is exceeded; prints the measured differences.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "emu.hpp"
#define __shared__ static  // one block at a time (emu::launch): statics are the block's shared memory
#include "moe_kernels.inc"  // kernels/moe.cu's kernels, made host code by run.sh
#include "ringtrain/nn/backend.hpp"

using namespace ringtrain;
using namespace ringtrain::cuda;

namespace {

template <class T>
Tensor wrap(std::vector<T>& v, const Shape& s) {
  return Tensor::wrap(v.data(), s, dtype_of<T>::value);
}
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}
bool check(const char* what, double got, double bound) {
  std::printf("  %-46s max |emulated - cpu| %.3g (bound %.0e)\n", what, got, bound);
  return got <= bound;
}

bool run(std::int64_t n, int E, int k, std::int64_t D, bool ties, bool bias, unsigned seed) {
  Backend& cpu = backend_for(Device::cpu());
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-3, 3);
  std::printf("n %lld tokens, E %d, k %d, D %lld%s%s\n", (long long)n, E, k, (long long)D, ties ? ", tied logits" : "",
              bias ? ", selection bias" : "");
  bool ok = true;
  // 1. Router.
  std::vector<float> logits(static_cast<std::size_t>(n * E)), b(static_cast<std::size_t>(E));
  for (auto& v : logits) v = ties ? float(int(u(g))) : u(g);  // ties: a handful of integer values repeat
  for (auto& v : b) v = bias ? 0.05f * float(int(u(g))) : 0.f;
  std::vector<float> pc = logits, pe = logits, gc(std::size_t(n * k)), ge(std::size_t(n * k), 9.f);
  std::vector<std::int32_t> ec(std::size_t(n * k)), ee(std::size_t(n * k), -7);
  std::vector<double> sc(static_cast<std::size_t>(E)), se(std::size_t(E), 5.0);
  {
    Tensor p = wrap(pc, {n, E}), e = wrap(ec, {n, k}), gt = wrap(gc, {n, k}), s = wrap(sc, {E});
    cpu.moe_route(p, bias ? wrap(b, {E}) : Tensor(), k, e, gt, s);
  }
  MoeRoute r{pe.data(), bias ? b.data() : nullptr, ee.data(), ge.data(), se.data(), n, E, k};
  emu::launch(unsigned((n + 127) / 128), 1, 4, [&] { moe_route_kernel(r); });
  emu::launch(unsigned((E + 127) / 128), 1, 4, [&] { moe_psum_kernel(r); });
  const bool same_experts = ec == ee;
  std::printf("  %-46s %s\n", "top-k experts (ties to the lower index)", same_experts ? "identical" : "DIFFER");
  ok &= same_experts;
  ok &= check("probabilities", max_diff(pc, pe), 1e-7);
  ok &= check("gates", max_diff(gc, ge), 1e-7);
  double ps = 0;
  for (int e = 0; e < E; ++e) ps = std::max(ps, std::abs(sc[std::size_t(e)] - se[std::size_t(e)]));
  ok &= check("probability sums (double)", ps, 1e-12);
  // 2. Rows in expert order: a permutation with dropped (-1) entries.
  const std::int64_t R = n * k;
  std::vector<float> src(std::size_t(n * D));
  for (auto& v : src) v = u(g);
  std::vector<std::int64_t> idx(std::size_t(R + 5));
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = (i % 7 == 3) ? -1 : std::int64_t((i * 5 + 1) % std::size_t(n));
  std::vector<float> dc(idx.size() * std::size_t(D)), de(dc.size(), 3.f);
  {
    Tensor d = wrap(dc, {std::int64_t(idx.size()), D});
    cpu.moe_gather_rows(wrap(src, {n, D}), wrap(idx, {std::int64_t(idx.size())}), d);
  }
  emu::launch(unsigned(idx.size()), 1, 4, [&] { moe_gather_kernel(src.data(), idx.data(), de.data(), D); });
  ok &= check("gathered rows (bitwise: 0)", max_diff(dc, de), 0);
  // 3. Combine: each assignment a row of `rows` (some dropped), gates from the router.
  std::vector<float> rows(std::size_t(R * D));
  for (auto& v : rows) v = u(g);
  std::vector<std::int64_t> row(static_cast<std::size_t>(R));
  for (std::int64_t a = 0; a < R; ++a) row[std::size_t(a)] = (a % 5 == 4) ? -1 : (a * 3) % R;
  std::vector<float> yc(std::size_t(n * D), 1.f), ye(yc.size(), 2.f);  // pass 0 must overwrite them all
  std::vector<std::int64_t> tokens;
  for (std::int64_t t = 0; t < n; t += 2) tokens.push_back(t);
  for (int pass = 0; pass < 3; ++pass) {  // all tokens; the even ones again (a list); accumulate with gates of 1
    const bool list = pass == 1, acc = pass == 2;
    Tensor y = wrap(yc, {n, D});
    cpu.moe_combine(wrap(rows, {R, D}), wrap(row, {R}), acc ? Tensor() : wrap(gc, {R}), k,
                    list ? wrap(tokens, {std::int64_t(tokens.size())}) : Tensor(), y, acc);
    MoeCombine c{rows.data(), row.data(), acc ? nullptr : ge.data(), list ? tokens.data() : nullptr, ye.data(), D, k,
                 acc};
    emu::launch(unsigned(list ? tokens.size() : std::size_t(n)), 1, 4, [&] { moe_combine_kernel(c); });
    ok &= check(pass == 0 ? "combine" : pass == 1 ? "combine (token list)" : "combine (accumulate, gates 1)",
                max_diff(yc, ye), 1e-6);
  }
  // 4. Combine backward and the router's backward.
  std::vector<float> dy(std::size_t(n * D));
  for (auto& v : dy) v = u(g);
  std::vector<float> dgc(static_cast<std::size_t>(R)), dge(std::size_t(R), 4.f), drc(rows.size(), 0.f), dre(rows.size(), 0.f);
  {
    Tensor dg = wrap(dgc, {R}), dr = wrap(drc, {R, D});
    cpu.moe_combine_backward(wrap(dy, {n, D}), wrap(rows, {R, D}), wrap(row, {R}), wrap(gc, {R}), k, dg, dr);
  }
  MoeCombine cb{rows.data(), row.data(), ge.data(), nullptr, nullptr, D, k, false};
  emu::launch(unsigned(R), 1, 4, [&] { moe_combine_backward_kernel(cb, dy.data(), dge.data(), dre.data()); });
  ok &= check("combine backward: d gates", max_diff(dgc, dge), 1e-5);
  ok &= check("combine backward: d rows (bitwise: 0)", max_diff(drc, dre), 0);
  std::vector<float> f(static_cast<std::size_t>(E));
  for (auto& v : f) v = std::abs(u(g)) / float(E);
  const double aux_g = 0.01 * E / double(n);
  std::vector<float> dlc(std::size_t(n * E)), dle(dlc.size(), 6.f);
  {
    Tensor dl = wrap(dlc, {n, E});
    cpu.moe_router_backward(wrap(pc, {n, E}), wrap(ec, {n, k}), wrap(gc, {n, k}), wrap(dgc, {n, k}), wrap(f, {E}),
                            aux_g, dl);
  }
  MoeRouterBackward rb{pe.data(), ee.data(), ge.data(), dge.data(), f.data(), aux_g, dle.data(), n, E, k};
  emu::launch(unsigned((n + 127) / 128), 1, 4, [&] { moe_router_backward_kernel(rb); });
  ok &= check("router backward: d logits", max_diff(dlc, dle), 1e-6);
  return ok;
}

}  // namespace

int main() {
  bool ok = true;
  ok &= run(37, 8, 2, 24, false, false, 1);
  ok &= run(130, 4, 2, 40, true, false, 2);   // tied logits, two blocks of tokens
  ok &= run(64, 16, 4, 200, true, true, 3);   // ties under a selection bias; D over one block's 128 threads
  ok &= run(9, 8, 1, 8, false, true, 4);      // top-1
  std::printf("moe kernels: %s\n", ok ? "all within bounds" : "FAILED");
  return ok ? 0 : 1;
}
