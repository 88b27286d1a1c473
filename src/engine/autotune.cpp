// The autotuner's search and the step cost model that seeds it (pure: no MPI;
// autotune_session.cpp runs them inside the engine).
#include "ringtrain/engine/autotune.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "ringtrain/core/error.hpp"

namespace ringtrain {

// ---- grid ---------------------------------------------------------------------

int TuneGrid::size() const {
  return static_cast<int>(fusion.size() * cycle_ms.size() * algos.size() * algos.size());
}
std::vector<int> TuneGrid::dims() const {
  return {static_cast<int>(fusion.size()), static_cast<int>(cycle_ms.size()), static_cast<int>(algos.size()),
          static_cast<int>(algos.size())};
}
std::vector<int> TuneGrid::coords(int i) const {
  std::vector<int> c;
  for (int d : dims()) {
    c.push_back(i % d);
    i /= d;
  }
  return c;
}
TuneSetting TuneGrid::at(int i) const {
  auto c = coords(i);
  return {fusion[c[0]], cycle_ms[c[1]], algos[c[2]], algos[c[3]]};
}
int TuneGrid::nearest(const TuneSetting& s) const {
  auto closest = [](const auto& values, double v) {
    int best = 0;
    for (int i = 1; i < static_cast<int>(values.size()); ++i)
      if (std::fabs(std::log1p(double(values[i])) - std::log1p(v)) <
          std::fabs(std::log1p(double(values[best])) - std::log1p(v)))
        best = i;
    return best;
  };
  auto algo = [&](Algorithm a) {
    auto it = std::find(algos.begin(), algos.end(), a);
    return it == algos.end() ? 0 : static_cast<int>(it - algos.begin());
  };
  auto d = dims();
  return closest(fusion, double(s.fusion_threshold)) +
         d[0] * (closest(cycle_ms, s.cycle_time_ms) + d[1] * (algo(s.small) + d[2] * algo(s.large)));
}

TuneGrid default_tune_grid(std::size_t step_bytes, int ranks, int nodes, int max_local) {
  TuneGrid g;
  for (std::size_t f = std::size_t{256} << 10;; f *= 4) {
    g.fusion.push_back(f);
    if (f >= step_bytes || f >= (std::size_t{1} << 30)) break;
  }
  g.cycle_ms = {0.5, 1.0, 2.0, 5.0};
  g.algos = {Algorithm::ring, Algorithm::tree};
  if (ranks > 1 && max_local > 1) g.algos.push_back(nodes == 1 ? Algorithm::shm : Algorithm::hierarchical);
  return g;
}

// ---- search -------------------------------------------------------------------

namespace {
constexpr double kRidge = 0.02;    // pulls untried values' corrections to 0 (the model's own guess)
constexpr double kExplore = 0.04;  // per untried value: the bonus that makes a candidate worth a look
constexpr double kGiveUp = 1.10;  // stop once nothing (exploration bonus included) is predicted within 10% of the best
constexpr int kFinalists = 2;     // candidates confirmed at the end, measured alternately
constexpr int kConfirmed = 3;     // measurements each finalist gets (budget permitting)
constexpr double kHuberMin = 0.02;  // floor of the Huber threshold (log space): 2%

// Solves A x = b (n x n, row-major) by Gaussian elimination with partial pivoting.
std::vector<double> solve(std::vector<double> A, std::vector<double> b) {
  const int n = static_cast<int>(b.size());
  for (int k = 0; k < n; ++k) {
    int p = k;
    for (int i = k + 1; i < n; ++i)
      if (std::fabs(A[i * n + k]) > std::fabs(A[p * n + k])) p = i;
    for (int j = 0; j < n; ++j) std::swap(A[k * n + j], A[p * n + j]);
    std::swap(b[k], b[p]);
    if (std::fabs(A[k * n + k]) < 1e-300) continue;
    for (int i = k + 1; i < n; ++i) {
      double f = A[i * n + k] / A[k * n + k];
      for (int j = k; j < n; ++j) A[i * n + j] -= f * A[k * n + j];
      b[i] -= f * b[k];
    }
  }
  std::vector<double> x(n, 0.0);
  for (int k = n - 1; k >= 0; --k) {
    if (std::fabs(A[k * n + k]) < 1e-300) continue;
    double s = b[k];
    for (int j = k + 1; j < n; ++j) s -= A[k * n + j] * x[j];
    x[k] = s / A[k * n + k];
  }
  return x;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

Autotuner::Autotuner(std::vector<int> dims, std::vector<double> prior, int budget, int first)
    : dims_(std::move(dims)), prior_(std::move(prior)), budget_(budget), first_(first) {
  int n = 1, off = 0;
  for (int d : dims_) {
    RT_CHECK(d >= 1, "Autotuner: every dimension needs at least one value");
    n *= d;
    offset_.push_back(off);
    off += d;
  }
  if (prior_.empty()) prior_.assign(n, 1.0);
  RT_CHECK(static_cast<int>(prior_.size()) == n, "Autotuner: ", prior_.size(), " prior costs for ", n, " candidates");
  for (double p : prior_) RT_CHECK(p > 0 && std::isfinite(p), "Autotuner: prior costs must be finite and > 0");
  RT_CHECK(budget >= 3, "Autotuner: a budget of ", budget, " samples; at least 3 are needed");
  RT_CHECK(first >= 0 && first < n, "Autotuner: first candidate ", first, " is not in 0..", n - 1);
  w_.assign(1 + off, 0.0);
  costs_.assign(n, {});
  why_.assign(n, "");
  next_ = first_;
  why_[first_] = "baseline";
}

std::vector<int> Autotuner::coords(int c) const {
  std::vector<int> v;
  for (int d : dims_) {
    v.push_back(c % d);
    c /= d;
  }
  return v;
}

double Autotuner::measured(int c) const {
  const auto& v = costs_[c];
  return v.empty() ? std::numeric_limits<double>::quiet_NaN() : *std::min_element(v.begin(), v.end());
}

double Autotuner::predicted(int c) const {
  double s = w_[0];
  auto v = coords(c);
  for (std::size_t d = 0; d < dims_.size(); ++d) s += w_[1 + offset_[d] + v[d]];
  return prior_[c] * std::exp(s);
}

// The corrected model, moved towards c's own measurements by n / (n + 2) of
// their median log residual: one sample cannot outvote the model, three can
// (mostly) when the model's separable form misses an interaction.
double Autotuner::score(int c) const {
  const auto& v = costs_[c];
  const double p = predicted(c);
  if (v.empty()) return p;
  std::vector<double> r;
  for (double x : v) r.push_back(std::log(x / p));
  const double n = static_cast<double>(v.size());
  return p * std::exp(n / (n + 2.0) * median_of(r));
}

const char* Autotuner::why(int c) const { return why_[c]; }

int Autotuner::best() const {
  int b = -1;
  for (int c = 0; c < static_cast<int>(costs_.size()); ++c)
    if (!costs_[c].empty() && (b < 0 || score(c) < score(b))) b = c;
  return b;
}

void Autotuner::record(int candidate, double cost) {
  RT_CHECK(candidate == next_, "Autotuner::record: measured candidate ", candidate, " but ", next_, " was asked for");
  RT_CHECK(cost > 0 && std::isfinite(cost), "Autotuner::record: cost must be finite and > 0, got ", cost);
  history_.push_back({candidate, cost});
  costs_[candidate].push_back(cost);
  refit();
  next_ = choose();
}

// Ridge regression of log(cost / prior) on an intercept (not penalised) and
// one indicator per (dimension, value), over every measurement. Load only adds
// time, but it adds it to every candidate alike in expectation, so it ends in
// the intercept and leaves the ranking alone; its outliers (a step that shared
// a core, a "lucky" quiet sample) are what moves a ranking, so the fit is
// Huber-weighted (iteratively reweighted, threshold 1.345 robust sigmas of the
// residuals) and one odd sample counts for little once others disagree.
void Autotuner::refit() {
  const int k = static_cast<int>(w_.size());
  std::vector<std::vector<int>> idx;
  std::vector<double> r;
  for (auto& [c, cost] : history_) {
    std::vector<int> row{0};
    auto v = coords(c);
    for (std::size_t d = 0; d < dims_.size(); ++d) row.push_back(1 + offset_[d] + v[d]);
    idx.push_back(std::move(row));
    r.push_back(std::log(cost / prior_[c]));
  }
  std::vector<double> weight(r.size(), 1.0);
  for (int iter = 0; iter < 5; ++iter) {
    std::vector<double> A(k * k, 0.0), b(k, 0.0);
    for (int i = 1; i < k; ++i) A[i * k + i] = kRidge;
    for (std::size_t m = 0; m < r.size(); ++m)
      for (int i : idx[m]) {
        b[i] += weight[m] * r[m];
        for (int j : idx[m]) A[i * k + j] += weight[m];
      }
    w_ = solve(A, b);
    if (r.size() < 3) break;
    std::vector<double> res, absres;
    for (std::size_t m = 0; m < r.size(); ++m) {
      double fit = 0;
      for (int i : idx[m]) fit += w_[i];
      res.push_back(r[m] - fit);
      absres.push_back(std::fabs(r[m] - fit));
    }
    const double delta = std::max(kHuberMin, 1.345 * 1.4826 * median_of(absres));
    for (std::size_t m = 0; m < r.size(); ++m)
      weight[m] = absres[m] <= delta ? 1.0 : delta / absres[m];
  }
}

int Autotuner::choose() const {
  const int n = static_cast<int>(costs_.size());
  const int used = samples();
  if (used >= budget_) return -1;
  const int best_c = best();
  auto& why = const_cast<std::vector<const char*>&>(why_);
  // Keep enough samples to confirm the finalists (fewer on a small budget).
  const int reserve = std::min(kFinalists * (kConfirmed - 1), std::max(2, budget_ / 4));
  if (used < budget_ - reserve) {
    // Values of each dimension seen in some measurement.
    std::vector<char> seen(w_.size(), 0);
    for (int c = 0; c < n; ++c)
      if (!costs_[c].empty()) {
        auto v = coords(c);
        for (std::size_t d = 0; d < dims_.size(); ++d) seen[1 + offset_[d] + v[d]] = 1;
      }
    int pick = -1, pick_new = 0;
    double pick_score = 0;
    for (int c = 0; c < n; ++c) {
      if (!costs_[c].empty()) continue;
      auto v = coords(c);
      int unseen = 0;
      for (std::size_t d = 0; d < dims_.size(); ++d) unseen += !seen[1 + offset_[d] + v[d]];
      double s = predicted(c) * (1.0 - kExplore * unseen);
      if (pick < 0 || s < pick_score) pick = c, pick_score = s, pick_new = unseen;
    }
    if (pick >= 0 && pick_score < kGiveUp * score(best_c)) {
      why[pick] = pick_new ? "explore" : "model";
      return pick;
    }
  }
  // Confirmation: the finalists (best scores) are measured in turn, the one
  // with fewer measurements first, and never the same one twice in a row
  // while the other still needs one, so slow drifts in load hit both alike.
  std::vector<int> order;
  for (int c = 0; c < n; ++c)
    if (!costs_[c].empty()) order.push_back(c);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return score(a) < score(b); });
  order.resize(std::min<std::size_t>(kFinalists, order.size()));
  const int last = history_.back().first;
  int pick = -1;
  for (int c : order) {
    if (static_cast<int>(costs_[c].size()) >= kConfirmed) continue;
    if (pick < 0 || costs_[c].size() < costs_[pick].size() || (pick == last && costs_[c].size() == costs_[pick].size()))
      pick = c;
  }
  if (pick < 0) return -1;
  why[pick] = "confirm";
  return pick;
}

// ---- cost model ---------------------------------------------------------------

double sample_cost(const std::vector<double>& step_s) {
  RT_CHECK(!step_s.empty(), "sample_cost: no steps");
  return *std::min_element(step_s.begin(), step_s.end());
}

AlphaBeta fit_alpha_beta(Algorithm a, const std::vector<std::size_t>& bytes, const std::vector<double>& seconds) {
  RT_CHECK(bytes.size() == seconds.size() && !bytes.empty(), "fit_alpha_beta: need matching, non-empty samples");
  // Weighted by 1/t^2: minimises the relative error, so the small sizes count as much as the large.
  double s = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    double w = 1.0 / std::max(1e-12, seconds[i] * seconds[i]), x = double(bytes[i]), y = seconds[i];
    s += w, sx += w * x, sy += w * y, sxx += w * x * x, sxy += w * x * y;
  }
  AlphaBeta f{a, 0, 0};
  const double det = s * sxx - sx * sx;
  if (std::fabs(det) > 1e-30 * s * sxx) {
    f.beta_s = std::max(0.0, (s * sxy - sx * sy) / det);
    f.alpha_s = std::max(0.0, (sy - f.beta_s * sx) / s);
  } else {
    f.alpha_s = sy / s;
  }
  return f;
}

namespace {
double allreduce_s(Algorithm a, std::size_t bytes, const std::vector<AlphaBeta>& fits) {
  for (auto& f : fits)
    if (f.algo == a) return f.alpha_s + f.beta_s * double(bytes);
  RT_FAIL("autotune: no all-reduce time fit for algorithm ", algorithm_name(a));
}
constexpr double kWaiterPause_s = 1e-4;  // the engine's pause while a caller blocks in wait()
}  // namespace

double exposed_comm_s(const StepProfile& p, const TuneSetting& s, long long split, const std::vector<AlphaBeta>& fits) {
  RT_CHECK(p.submit_s.size() == p.bytes.size() && !p.bytes.empty(), "exposed_comm_s: empty step profile");
  const std::size_t n = p.bytes.size();
  const double last = p.submit_s.back(), cycle = s.cycle_time_ms * 1e-3;
  // One negotiation per cycle costs about a small all-reduce.
  const double negotiate = allreduce_s(s.small, 64, fits);
  std::size_t next = 0;
  double t = p.submit_s.front(), end = t;  // the first submission wakes the idle engine
  while (next < n) {
    t += negotiate;
    std::size_t upto = next;
    while (upto < n && p.submit_s[upto] <= t) ++upto;
    double start_of_cycle = t;
    // Buffers of <= fusion_threshold in submission order; one too big goes alone.
    std::size_t cur = 0;
    for (std::size_t i = next; i < upto; ++i) {
      if (cur && cur + p.bytes[i] > s.fusion_threshold) {
        t += allreduce_s(static_cast<long long>(cur) <= split ? s.small : s.large, cur, fits);
        cur = 0;
      }
      cur += p.bytes[i];
    }
    if (cur) t += allreduce_s(static_cast<long long>(cur) <= split ? s.small : s.large, cur, fits);
    end = t;
    next = upto;
    if (next >= n) break;
    // The next cycle: one cycle time after this one's negotiation, or at once
    // (0.1 ms) when the caller already waits, i.e. after the last submission.
    const double pause = std::max(1e-5, start_of_cycle >= last ? kWaiterPause_s : cycle);
    t = std::max(t, start_of_cycle - negotiate + pause);
  }
  return std::max(0.0, end - last);
}

std::vector<double> predict_steps(const StepProfile& p, const TuneGrid& g, int base, const std::vector<AlphaBeta>& fits) {
  const double rest = p.step_s - exposed_comm_s(p, g.at(base), g.split, fits);
  std::vector<double> out(g.size());
  for (int i = 0; i < g.size(); ++i)
    out[i] = std::max(1e-6, rest + exposed_comm_s(p, g.at(i), g.split, fits));
  return out;
}

}  // namespace ringtrain
