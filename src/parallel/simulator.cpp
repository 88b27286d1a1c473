#include "ringtrain/parallel/simulator.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "ringtrain/core/error.hpp"
#include "ringtrain/parallel/partition.hpp"

namespace ringtrain {

const StageCost& SimCosts::of(int g) const {
  static const StageCost unit;
  return stage.empty() ? unit : stage.at(static_cast<std::size_t>(g));
}

double SimCosts::message_s(int g) const {
  const auto i = static_cast<std::size_t>(g);
  return link.time(i < boundary_bytes.size() ? boundary_bytes[i] : 0.0);
}

double SimResult::mean_bubble() const {
  if (busy.empty()) return 0;
  double s = 0;
  for (std::size_t r = 0; r < busy.size(); ++r) s += bubble(static_cast<int>(r));
  return s / static_cast<double>(busy.size());
}

SimResult simulate(const Schedule& in, const SimCosts& costs) {
  const Schedule s = lower(in);
  const int p = s.layout.ranks;
  SimResult r;
  r.busy.assign(static_cast<std::size_t>(p), 0);
  r.peak.assign(static_cast<std::size_t>(p), 0);
  r.started.resize(static_cast<std::size_t>(p));
  std::vector<std::size_t> pc(static_cast<std::size_t>(p), 0);
  std::vector<double> clock(static_cast<std::size_t>(p), 0);
  std::vector<int> live(static_cast<std::size_t>(p), 0);
  // (receiving stage, 0 = activation | 1 = gradient, micro-batch) -> arrival time
  std::map<std::tuple<int, int, int>, double> arrives;
  for (;;) {
    bool moved = false, all = true;
    for (int k = 0; k < p; ++k) {
      const auto& list = s.ranks[static_cast<std::size_t>(k)];
      auto& c = clock[static_cast<std::size_t>(k)];
      while (pc[static_cast<std::size_t>(k)] < list.size()) {
        const Action& a = list[pc[static_cast<std::size_t>(k)]];
        double dur = 0;
        switch (a.op) {
          case Op::recv_act:
          case Op::recv_grad: {
            auto it = arrives.find({a.stage, a.op == Op::recv_act ? 0 : 1, a.mb});
            if (it == arrives.end()) goto blocked;
            c = std::max(c, it->second);
            break;
          }
          case Op::send_act: arrives[{a.stage + 1, 0, a.mb}] = c + costs.message_s(a.stage); break;
          case Op::send_grad: arrives[{a.stage - 1, 1, a.mb}] = c + costs.message_s(a.stage - 1); break;
          case Op::forward: dur = costs.of(a.stage).f; break;
          case Op::backward: dur = costs.of(a.stage).b(); break;
          case Op::backward_input: dur = costs.of(a.stage).i; break;
          case Op::backward_weight: dur = costs.of(a.stage).w; break;
          case Op::load_micro_batch: break;
        }
        if (is_compute(a.op)) {
          r.started[static_cast<std::size_t>(k)].push_back({c, a});
          auto& l = live[static_cast<std::size_t>(k)];
          if (a.op == Op::forward) r.peak[static_cast<std::size_t>(k)] = std::max(r.peak[static_cast<std::size_t>(k)], ++l);
          if (a.op == Op::backward || a.op == Op::backward_weight) --l;
        }
        c += dur;
        r.busy[static_cast<std::size_t>(k)] += dur;
        ++pc[static_cast<std::size_t>(k)];
        moved = true;
      }
    blocked:
      all &= pc[static_cast<std::size_t>(k)] == list.size();
    }
    if (all) break;
    if (!moved) {
      r.deadlock = true;
      for (int k = 0; k < p; ++k)
        if (pc[static_cast<std::size_t>(k)] < s.ranks[static_cast<std::size_t>(k)].size())
          r.where += cat(r.where.empty() ? "" : "; ", "rank ", k, " waits in ",
                         action_str(s.ranks[static_cast<std::size_t>(k)][pc[static_cast<std::size_t>(k)]]));
      return r;
    }
  }
  r.makespan = clock.empty() ? 0 : *std::max_element(clock.begin(), clock.end());
  return r;
}

}  // namespace ringtrain

namespace ringtrain {

ScheduleKind pick_schedule(const std::vector<double>& layer_costs, int p, int m, int virtual_stages, bool uniform_cut,
                           std::string* why) {
  const int n = static_cast<int>(layer_costs.size());
  ScheduleKind best = ScheduleKind::one_f_one_b;
  double best_step = 0, base_peak = 0;
  for (ScheduleKind k : {ScheduleKind::one_f_one_b, ScheduleKind::zb_h1, ScheduleKind::interleaved, ScheduleKind::zb_v}) {
    const PipelineLayout L = layout_for(k, p, virtual_stages);
    if (L.stages() > n || (k == ScheduleKind::interleaved && (m % p != 0 || virtual_stages < 2))) continue;
    const std::vector<int> cut = uniform_cut ? balance_uniform(n, L.stages()) : balance_by_cost(layer_costs, L.stages());
    SimCosts c;
    for (int g = 0, l = 0; g < L.stages(); ++g) {
      double f = 0;
      for (int j = 0; j < cut[static_cast<std::size_t>(g)]; ++j) f += layer_costs[static_cast<std::size_t>(l++)];
      c.stage.push_back({f, f, f});
    }
    const SimResult r = simulate(make_schedule(k, p, m, virtual_stages), c);
    double peak = 0;
    for (int x : r.peak) peak = std::max(peak, double(x) / L.chunks);
    if (k == ScheduleKind::one_f_one_b) base_peak = peak, best_step = r.makespan;
    const bool fits = peak <= base_peak + 1e-9;
    if (why) {
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.1f", 1e3 * r.makespan);
      *why += cat(why->empty() ? "" : "; ", schedule_name(k), " ", ms, " ms", fits ? "" : " (more activations than 1f1b)");
    }
    if (fits && r.makespan < best_step * (1 - 1e-9)) best = k, best_step = r.makespan;
  }
  return best;
}

}  // namespace ringtrain
