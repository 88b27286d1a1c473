// MoeShared (nn/moe.hpp: the MoE layers' metrics and bias updates) and the
// routing totals over a tensor group (moe_stats.hpp).
#include "moe_stats.hpp"

#include <algorithm>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/nn/moe.hpp"

namespace ringtrain {

void MoeShared::record(const std::string& layer, double aux, double max_over_mean, double dropped,
                       double assignments, const std::vector<double>& load) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(stats_.begin(), stats_.end(), [&](const MoeLayerStats& s) { return s.name == layer; });
  if (it == stats_.end()) {
    stats_.push_back(MoeLayerStats{layer});
    it = stats_.end() - 1;
  }
  it->forwards += 1;
  it->aux += aux;
  it->max_over_mean += max_over_mean;
  it->dropped += dropped;
  it->assignments += assignments;
  it->load.resize(std::max(it->load.size(), load.size()), 0.0);
  for (std::size_t e = 0; e < load.size(); ++e) it->load[e] += load[e];
}

void MoeShared::add_balanced(MoeMlp* layer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (std::find(balanced_.begin(), balanced_.end(), layer) == balanced_.end()) balanced_.push_back(layer);
}

void MoeShared::remove_balanced(MoeMlp* layer) {
  std::lock_guard<std::mutex> lock(mu_);
  balanced_.erase(std::remove(balanced_.begin(), balanced_.end(), layer), balanced_.end());
}

void MoeShared::update_bias(const Communicator* group, bool apply) {
  std::vector<double> all;  // every layer's loads, in registration order (the same on every rank of the group)
  for (MoeMlp* l : balanced_) {
    const auto load = l->take_load();
    all.insert(all.end(), load.begin(), load.end());
  }
  if (all.empty()) return;
  if (group && group->size() > 1)  // counts are integers: the f64 sum is exact, so every rank gets the same bias
    allreduce(all.data(), all.data(), all.size(), DType::f64, ReduceOp::sum, *group);
  if (!apply) return;
  std::size_t o = 0;
  for (MoeMlp* l : balanced_) {
    const auto E = static_cast<std::size_t>(l->spec().experts);
    l->update_bias(std::vector<double>(all.begin() + o, all.begin() + o + E));
    o += E;
  }
}

std::vector<MoeLayerStats> MoeShared::take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<MoeLayerStats> out = stats_;
  for (auto& s : stats_) s = MoeLayerStats{s.name};
  return out;
}

namespace detail {

RoutingTotals routing_totals(const std::vector<double>& local, int rows, int experts, std::int64_t tokens,
                             const TensorGroup& g) {
  const auto E = static_cast<std::size_t>(experts), R = static_cast<std::size_t>(rows), block = R * E + E;
  RT_CHECK(local.size() == block, "MoE routing totals: ", local.size(), " values for ", rows, " rows of ", experts,
           " experts");
  const int P = g.size;
  // Every rank's block (rank-major): counts are integers, so their f64 sums are
  // exact and every rank takes the same drops and bias updates; the probability
  // sums differ from one rank's only in the order of f64 additions.
  std::vector<double> all;
  if (P > 1) {
    all.resize(block * std::size_t(P));
    allgather(local.data(), block, all.data(), DType::f64, g.comm);
  }
  const double* blk = P > 1 ? all.data() : local.data();
  RoutingTotals t;
  t.count.assign(E, 0.0);
  t.prob.assign(E, 0.0);
  t.before.assign(R * E, 0.0);
  t.tokens = double(tokens) * P;
  std::vector<double> run(E, 0.0);  // assignments in the whole order so far
  for (std::size_t r = 0; r < R; ++r)
    for (int q = 0; q < P; ++q) {
      const double* c = blk + std::size_t(q) * block + r * E;
      if (q == (P > 1 ? g.rank : 0)) std::copy(run.begin(), run.end(), t.before.begin() + std::ptrdiff_t(r * E));
      for (std::size_t e = 0; e < E; ++e) run[e] += c[e];
    }
  t.count = run;
  for (int q = 0; q < P; ++q)
    for (std::size_t e = 0; e < E; ++e) t.prob[e] += blk[std::size_t(q) * block + R * E + e];
  return t;
}

}  // namespace detail
}  // namespace ringtrain
