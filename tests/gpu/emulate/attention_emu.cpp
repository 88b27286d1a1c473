// tests/gpu/emulate/run.sh: the kernels of cuda/kernels/attention.cu on the
// CPU (emu.hpp) against attention in double, forward (out, log-sum-exp) and
// backward (dq, dk, dv: together and each), causal or not, at shapes with partial 32-token tiles,
// odd head widths and widths above 128; every dqkv element must be written.
// Prints the max-norm relative errors and exits 1 if a float32 one exceeds
// 1e-5 or a bfloat16/float16 one 1e-2 (the bounds of tests/gpu/attention.cpp).
#include "emu.hpp"
#include "ringtrain/comm/reduce_math.hpp"
#include <cstdio>
#include <random>
#include <type_traits>
#include "kernels.inc"  // kernels/attention.cu's kernels, made host code by run.sh

using namespace ringtrain;
using namespace ringtrain::cuda;

template <typename T, int NC>
double run(int n, int t, int h, int hd, bool causal, unsigned seed) {
  const std::int64_t d = h * hd, ld = 3 * d;
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<float> qkvf(n * t * ld), doutf(n * t * d);
  for (auto& v : qkvf) v = u(g);
  for (auto& v : doutf) v = u(g) / 2;
  std::vector<T> qkv(qkvf.size()), dout(doutf.size()), out(n * t * d), dqkv(qkvf.size());
  for (size_t i = 0; i < qkv.size(); ++i) { qkv[i] = from_acc<T>(acc_t<T>(qkvf[i])); qkvf[i] = float(to_acc(qkv[i])); }
  for (size_t i = 0; i < dout.size(); ++i) { dout[i] = from_acc<T>(acc_t<T>(doutf[i])); doutf[i] = float(to_acc(dout[i])); }
  for (auto& v : dqkv) v = from_acc<T>(acc_t<T>(12345.f));  // must all be overwritten
  std::vector<float> lse(n * h * t, 777.f), dd(n * h * t, 777.f);
  const float scale = 1.0f / std::sqrt(float(hd));
  Geo geo{t, h, hd, d, ld, scale, causal};
  const unsigned tiles = (t + 31) / 32;
  emu::launch(n * h, tiles, fwd_smem(hd), [&] { fa_forward<T, NC>(qkv.data(), out.data(), lse.data(), geo); });
  const std::int64_t rows = std::int64_t(n) * h * t;
  emu::launch((rows + 3) / 4, 1, 4, [&] { fa_rowdot<T>(out.data(), dout.data(), dd.data(), rows, geo); });
  emu::launch(n * h, tiles, kv_smem(hd), [&] { fa_backward_kv<T, NC>(qkv.data(), dout.data(), lse.data(), dd.data(), dqkv.data(), geo); });
  emu::launch(n * h, tiles, q_smem(hd), [&] { fa_backward_q<T, NC>(qkv.data(), dout.data(), lse.data(), dd.data(), dqkv.data(), geo); });
  // reference in double
  std::vector<double> ro(n * t * d), rd(qkvf.size());
  double eo = 0, mo = 0, ed = 0, md = 0, el = 0, ep[3] = {0, 0, 0}, mp[3] = {0, 0, 0};
  for (int s = 0; s < n; ++s)
    for (int hh = 0; hh < h; ++hh) {
      auto Q = [&](int i, int k) { return double(qkvf[(s * t + i) * ld + hh * hd + k]); };
      auto K = [&](int i, int k) { return double(qkvf[(s * t + i) * ld + d + hh * hd + k]); };
      auto V = [&](int i, int k) { return double(qkvf[(s * t + i) * ld + 2 * d + hh * hd + k]); };
      auto DO = [&](int i, int k) { return double(doutf[(s * t + i) * d + hh * hd + k]); };
      std::vector<double> P(t * t, 0.0), dS(t * t, 0.0);
      for (int i = 0; i < t; ++i) {
        double m = -1e300;
        for (int j = 0; j < t; ++j) {
          if (causal && j > i) continue;
          double sc = 0;
          for (int k = 0; k < hd; ++k) sc += Q(i, k) * K(j, k);
          P[i * t + j] = sc * scale;
          m = std::max(m, sc * scale);
        }
        double z = 0;
        for (int j = 0; j < t; ++j) if (!(causal && j > i)) { P[i * t + j] = std::exp(P[i * t + j] - m); z += P[i * t + j]; }
        for (int j = 0; j < t; ++j) P[i * t + j] /= z;
        el = std::max(el, std::fabs(lse[(s * h + hh) * t + i] - (m + std::log(z))));
        for (int k = 0; k < hd; ++k) {
          double o = 0;
          for (int j = 0; j < t; ++j) o += P[i * t + j] * V(j, k);
          const double got = to_acc(out[(s * t + i) * d + hh * hd + k]);
          eo = std::max(eo, std::fabs(got - o));
          mo = std::max(mo, std::fabs(o));
        }
        // dS
        double D = 0;
        std::vector<double> dP(t);
        for (int j = 0; j < t; ++j) { double x = 0; for (int k = 0; k < hd; ++k) x += DO(i, k) * V(j, k); dP[j] = x; D += x * P[i * t + j]; }
        for (int j = 0; j < t; ++j) dS[i * t + j] = P[i * t + j] * (dP[j] - D);
      }
      for (int i = 0; i < t; ++i)
        for (int k = 0; k < hd; ++k) {
          double dq = 0, dk = 0, dv = 0;
          for (int j = 0; j < t; ++j) {
            dq += dS[i * t + j] * K(j, k);
            dk += dS[j * t + i] * Q(j, k);
            dv += P[j * t + i] * DO(j, k);
          }
          dq *= scale; dk *= scale;
          const std::int64_t base = (s * t + i) * ld + hh * hd + k;
          const double r[3] = {dq, dk, dv};
          for (int p = 0; p < 3; ++p) {
            const double got = to_acc(dqkv[base + p * d]);
            ed = std::max(ed, std::fabs(got - r[p]));
            md = std::max(md, std::fabs(r[p]));
            ep[p] = std::max(ep[p], std::fabs(got - r[p]));
            mp[p] = std::max(mp[p], std::fabs(r[p]));
          }
        }
    }
  std::printf("n %d t %3d h %d hd %3d causal %d %-8s: out rel %.2e  dqkv rel %.2e (q %.2e k %.2e v %.2e)  lse abs %.2e\n", n, t, h, hd, causal,
              std::is_same_v<T, float> ? "float" : std::is_same_v<T, bfloat16> ? "bfloat16" : "float16", eo / mo, ed / md, t > 1 ? ep[0] / mp[0] : 0.0, t > 1 ? ep[1] / mp[1] : 0.0, ep[2] / mp[2], el);
  double worst = std::max(eo / mo, ed / md);
  for (int p = 0; p < 3 && t > 1; ++p) worst = std::max(worst, ep[p] / mp[p]);  // each part (T = 1: q, k are 0)
  return worst;
}

int main() {
  double w = 0;
  w = std::max(w, run<float, 1>(2, 1, 1, 16, true, 1));
  w = std::max(w, run<float, 1>(2, 7, 3, 5, true, 2));
  w = std::max(w, run<float, 1>(1, 33, 2, 16, true, 3));
  w = std::max(w, run<float, 2>(1, 70, 2, 64, true, 4));
  w = std::max(w, run<float, 2>(1, 70, 2, 64, false, 5));
  w = std::max(w, run<float, 1>(2, 45, 1, 32, false, 6));
  w = std::max(w, run<float, 8>(1, 40, 1, 200, true, 7));
  w = std::max(w, run<float, 4>(1, 64, 1, 100, true, 8));
  w = std::max(w, run<float, 2>(2, 130, 3, 64, true, 11));
  std::printf("worst float %.2e\n", w);
  double b = std::max(run<bfloat16, 2>(1, 70, 2, 64, true, 9), run<bfloat16, 1>(2, 7, 3, 5, false, 10));
  b = std::max(b, run<float16, 2>(1, 70, 2, 64, true, 12));
  b = std::max(b, run<bfloat16, 2>(1, 257, 3, 64, true, 13));  // test_gpu_attention's longest, in bf16
  b = std::max(b, run<bfloat16, 2>(1, 257, 3, 64, false, 14));
  b = std::max(b, run<bfloat16, 8>(1, 45, 1, 200, true, 15));
  std::printf("worst bfloat16, float16 %.2e\n", b);
  return w <= 1e-5 && b <= 1e-2 ? 0 : 1;
}
