// tests/gpu/emulate/run.sh: the kernels of cuda/kernels/vocab_parallel.cu on
// the CPU (emu.hpp), a vocabulary split into `parts` slices in one process
// (the group's all-reduces are sums here), against
//  - the CPU backend's algorithm (src/backend/cpu/vocab_parallel.cpp, its
//    loops restated here in the same order): row maxima and first argmax
//    bitwise, the loss and dlogits within the rounding of a double sum taken
//    in another order;
//  - the unsplit softmax cross-entropy in double (loss, dlogits) and the whole
//    row's first argmax (hits, ties across slices included);
//  - a bad label: the smallest bad row is reported.
// Exits 1 when a bound is exceeded; prints the measured differences.
#include <climits>
#include <cstdio>
#include <random>

#include "emu.hpp"
#define __shared__ static  // one block at a time (emu::launch): statics are the block's shared memory
#include "vocab_kernels.inc"  // kernels/vocab_parallel.cu's kernels, made host code by run.sh

using namespace ringtrain::cuda;

namespace {

struct Result {
  double loss_vs_cpu = 0, loss_vs_whole = 0, grad_vs_cpu = 0, grad_vs_whole = 0;
  bool ok = true;
};

Result run(std::int64_t rows, std::int64_t local, int parts, bool ties, unsigned seed) {
  const std::int64_t vocab = local * parts;
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-8, 8);
  std::vector<float> whole(std::size_t(rows * vocab));
  for (auto& v : whole) v = ties ? float(int(u(g)) % 3) : u(g);  // ties: values from {-2..2} repeat across slices
  if (!ties) whole[std::size_t(vocab / 2)] += 80;                  // a large logit: the shift by the maximum matters
  std::vector<std::int64_t> labels(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) labels[std::size_t(r)] = (r * 7 + 3) % vocab;
  if (ties)  // some labels at a row's first maximum, some at a later one
    for (std::int64_t r = 0; r < rows; r += 2) {
      const float* x = &whole[std::size_t(r * vocab)];
      labels[std::size_t(r)] = std::max_element(x, x + vocab) - x;
    }
  std::vector<std::vector<float>> x(parts), d(parts);
  std::vector<std::vector<std::int64_t>> best(parts);
  std::vector<float> maxes(std::size_t(rows * parts), 0.f);
  std::vector<double> sums(std::size_t(2 * rows), 0.0);
  double hits = 0, loss = 0;
  Result res;
  std::vector<VocabSlice> sl(parts);
  for (int p = 0; p < parts; ++p) {
    x[p].resize(std::size_t(rows * local));
    d[p].assign(std::size_t(rows * local), 12345.f);  // must all be written
    best[p].assign(std::size_t(rows), -1);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < local; ++j) x[p][std::size_t(r * local + j)] = whole[std::size_t(r * vocab + p * local + j)];
    sl[p] = VocabSlice{x[p].data(), labels.data(), rows, local, p * local, p, parts};
  }
  // 1. maxima (summed over the parts), checked bitwise against each slice's first maximum.
  for (int p = 0; p < parts; ++p) {
    std::vector<float> m(std::size_t(rows * parts), 777.f);
    unsigned long long bad = ~0ull;
    emu::launch(unsigned(rows), 1, 4, [&] { vocab_row_max_kernel(sl[p], m.data(), best[p].data(), &bad); });
    if (bad != ~0ull) res.ok = false;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = &x[p][std::size_t(r * local)];
      const std::int64_t at = std::max_element(xr, xr + local) - xr;
      if (best[p][std::size_t(r)] != at || m[std::size_t(r * parts + p)] != xr[at]) res.ok = false;
      for (int k = 0; k < parts; ++k) {
        if (k != p && m[std::size_t(r * parts + k)] != 0.f) res.ok = false;
        maxes[std::size_t(r * parts + k)] += m[std::size_t(r * parts + k)];
      }
    }
  }
  // 2. sums, 3. loss and gradient, 4. hits.
  for (int p = 0; p < parts; ++p) {
    std::vector<double> s(std::size_t(2 * rows), -1.0);
    emu::launch(unsigned(rows), 1, 4, [&] { vocab_xent_sums_kernel(sl[p], maxes.data(), s.data()); });
    for (std::size_t i = 0; i < s.size(); ++i) sums[i] += s[i];
  }
  for (int p = 0; p < parts; ++p) {
    std::vector<double> row_loss(static_cast<std::size_t>(rows));
    double l = 0, h = 0;
    emu::launch(unsigned(rows), 1, 4, [&] { vocab_xent_grad_kernel(sl[p], maxes.data(), sums.data(), d[p].data(), row_loss.data()); });
    emu::launch(1, 1, 4, [&] { vocab_mean_kernel(row_loss.data(), rows, &l); });
    emu::launch(1, 1, 4, [&] { vocab_hits_kernel(sl[p], maxes.data(), best[p].data(), &h); });
    if (p == 0) loss = l;
    else if (l != loss) res.ok = false;  // every part computes the same loss from the same sums
    hits += h;
  }
  // The CPU backend's loops (vocab_parallel.cpp), and the unsplit loss in double.
  double cpu_loss = 0, whole_loss = 0, whole_hits = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    float m = -INFINITY;
    for (int k = 0; k < parts; ++k) m = std::max(m, maxes[std::size_t(r * parts + k)]);
    double z = 0;  // the CPU sums each slice in column order, then the group sums the slices
    for (int p = 0; p < parts; ++p) {
      double zp = 0;
      for (std::int64_t j = 0; j < local; ++j) zp += std::exp(double(x[p][std::size_t(r * local + j)]) - m);
      z += zp;
    }
    const std::int64_t y = labels[std::size_t(r)];
    cpu_loss += std::log(z) + m - double(whole[std::size_t(r * vocab + y)]);
    const float* xr = &whole[std::size_t(r * vocab)];
    const double wm = *std::max_element(xr, xr + vocab);
    double wz = 0;
    for (std::int64_t j = 0; j < vocab; ++j) wz += std::exp(double(xr[j]) - wm);
    whole_loss += wm + std::log(wz) - xr[y];
    whole_hits += (std::max_element(xr, xr + vocab) - xr) == y;
    for (int p = 0; p < parts; ++p)
      for (std::int64_t j = 0; j < local; ++j) {
        const double xv = x[p][std::size_t(r * local + j)], on = p * local + j == y ? 1.0 : 0.0;
        const float cpu = float((std::exp(xv - m) / z - on) / double(rows));
        const double ref = (std::exp(xv - wm) / wz - on) / double(rows);
        const float got = d[p][std::size_t(r * local + j)];
        res.grad_vs_cpu = std::max(res.grad_vs_cpu, std::fabs(double(got) - double(cpu)));
        res.grad_vs_whole = std::max(res.grad_vs_whole, std::fabs(double(got) - ref));
      }
  }
  cpu_loss /= double(rows);
  whole_loss /= double(rows);
  res.loss_vs_cpu = std::fabs(loss - cpu_loss) / std::fabs(cpu_loss);
  res.loss_vs_whole = std::fabs(loss - whole_loss) / std::fabs(whole_loss);
  if (hits != whole_hits) res.ok = false;
  std::printf("rows %3lld local %4lld parts %d ties %d: loss %.6f (vs CPU order %.1e, vs unsplit %.1e relative), "
              "dlogits vs CPU order %.1e, vs unsplit %.1e; hits %.0f of %lld (unsplit %.0f)%s\n",
              (long long)rows, (long long)local, parts, int(ties), loss, res.loss_vs_cpu, res.loss_vs_whole,
              res.grad_vs_cpu, res.grad_vs_whole, hits, (long long)rows, whole_hits, res.ok ? "" : "  MISMATCH");
  return res;
}

// A label outside [0, vocab) in two rows: the smaller row is reported.
bool bad_label_found() {
  std::vector<float> x(4 * 5, 0.f), m(4 * 2);
  std::vector<std::int64_t> y = {0, 10, 3, -1};  // rows 1 and 3 are bad for a vocabulary of 10
  VocabSlice a{x.data(), y.data(), 4, 5, 5, 1, 2};
  unsigned long long bad = ~0ull;
  emu::launch(4, 1, 4, [&] { vocab_row_max_kernel(a, m.data(), nullptr, &bad); });
  std::printf("bad labels in rows 1 and 3: reported row %llu\n", bad);
  return bad == 1;
}

}  // namespace

int main() {
  bool ok = bad_label_found();
  double loss = 0, grad = 0, loss_w = 0, grad_w = 0;
  for (auto [rows, local, parts, ties] : {std::tuple{6, 5, 2, false}, {40, 300, 2, false}, {33, 129, 4, false},
                                          {17, 1000, 3, false}, {40, 64, 2, true}, {21, 7, 4, true}}) {
    const Result r = run(rows, local, parts, ties, unsigned(rows * 131 + local));
    ok = ok && r.ok;
    loss = std::max(loss, r.loss_vs_cpu);
    grad = std::max(grad, r.grad_vs_cpu);
    loss_w = std::max(loss_w, r.loss_vs_whole);
    grad_w = std::max(grad_w, r.grad_vs_whole);
  }
  // Bounds: the CPU's order differs only in the double sums' order (1e-12
  // relative, 1e-9 absolute for dlogits: a float rounding of equal doubles);
  // the unsplit loss the CPU's own test bounds (5e-9 relative, 2e-7 absolute).
  ok = ok && loss <= 1e-12 && grad <= 1e-9 && loss_w <= 5e-9 && grad_w <= 2e-7;
  std::printf("worst: loss vs CPU order %.1e (bound 1e-12), dlogits vs CPU order %.1e (1e-9), "
              "loss vs unsplit %.1e (5e-9), dlogits vs unsplit %.1e (2e-7): %s\n",
              loss, grad, loss_w, grad_w, ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
