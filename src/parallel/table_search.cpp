// Tables rebuilt over measured costs (simulator.hpp): which backwards stay
// split (fuse_where_faster), the order of each rank's actions (improve_order)
// and the zero-bubble replan that tries both. The zero-bubble greedy places
// each action by unit-time rules; on real layers, whose chunks cost unequal
// amounts, it leaves a rank idle where another order would not.
#include <algorithm>
#include <map>
#include <utility>

#include "ringtrain/core/error.hpp"
#include "ringtrain/parallel/simulator.hpp"

namespace ringtrain {
namespace {

bool is_backward(Op op) { return op == Op::backward || op == Op::backward_input; }

// The rules a rank's list keeps under the search: per stage, its forwards and
// its backwards in micro-batch order (the order the built-in tables use, and
// the executor's receives are posted in), each backward after its forward,
// each W after its I, and between neighbouring stages on the rank, a forward
// after the one before it and a backward after the one after it (validate()'s
// rules). Cross-rank order is left to the play (a deadlock).
bool rank_order_ok(const std::vector<Action>& list, const PipelineLayout& L, int rank) {
  std::map<int, int> next_f, next_b;        // per stage: the micro-batch expected next
  std::map<std::pair<int, int>, int> done;  // (stage, mb) -> 1 F, 2 B or I, 3 W
  for (const Action& a : list) {
    const std::pair<int, int> k{a.stage, a.mb};
    if (a.op == Op::forward) {
      if (a.mb != next_f[a.stage]++) return false;
      if (a.stage > 0 && L.rank_of(a.stage - 1) == rank && done[{a.stage - 1, a.mb}] < 1) return false;
      done[k] = 1;
    } else if (is_backward(a.op)) {
      if (a.mb != next_b[a.stage]++ || done[k] != 1) return false;
      if (a.stage + 1 < L.stages() && L.rank_of(a.stage + 1) == rank && done[{a.stage + 1, a.mb}] < 2) return false;
      done[k] = 2;
    } else if (a.op == Op::backward_weight) {
      if (done[k] != 2) return false;
      done[k] = 3;
    }
  }
  return true;
}

// I(g, mb) at o[j] made a B, its W dropped.
void fuse_at(std::vector<Action>& o, std::size_t j) {
  const Action a = o[j];
  o[j].op = Op::backward;
  for (std::size_t q = j + 1; q < o.size(); ++q)
    if (o[q].op == Op::backward_weight && o[q].stage == a.stage && o[q].mb == a.mb) {
      o.erase(o.begin() + static_cast<std::ptrdiff_t>(q));
      return;
    }
}

// Only compute actions: a lowered table's are stripped of what lower() added.
Schedule compute_only(const Schedule& s) {
  Schedule c = s;
  for (auto& o : c.ranks) o.erase(std::remove_if(o.begin(), o.end(), [](const Action& a) { return !is_compute(a.op); }), o.end());
  return c;
}

// Keeps t where the simulator plays it faster than `best` (and updates best).
bool take_if_faster(Schedule& s, Schedule& t, const SimCosts& costs, double& best) {
  const SimResult x = simulate(t, costs);
  if (x.deadlock || x.makespan >= best * (1 - 1e-9)) return false;
  best = x.makespan;
  s = std::move(t);
  return true;
}

int largest(const std::vector<std::vector<int>>& per_chunk) {
  int most = 0;
  for (const auto& r : per_chunk)
    for (int c : r) most = std::max(most, c);
  return most;
}

}  // namespace

Schedule fuse_all(const Schedule& compute) {
  Schedule s = compute_only(compute);
  for (auto& o : s.ranks)
    for (std::size_t j = 0; j < o.size(); ++j)
      if (o[j].op == Op::backward_input) fuse_at(o, j);
  return s;
}

Schedule fuse_where_faster(const Schedule& compute, const SimCosts& costs, int passes) {
  Schedule s = compute_only(compute);
  double best = simulate(s, costs).makespan;
  for (int pass = 0; pass < passes; ++pass) {
    bool improved = false;
    for (std::size_t r = 0; r < s.ranks.size(); ++r)
      for (std::size_t j = 0; j < s.ranks[r].size(); ++j) {
        if (s.ranks[r][j].op != Op::backward_input) continue;
        Schedule t = s;
        fuse_at(t.ranks[r], j);
        improved |= take_if_faster(s, t, costs, best);
      }
    if (!improved) break;
  }
  return s;
}

Replan replan_zero_bubble(const Schedule& unit, ScheduleKind kind, const SimCosts& costs, double gain) {
  RT_CHECK(kind == ScheduleKind::zb_h1 || kind == ScheduleKind::zb_v, "replan_zero_bubble: ", schedule_name(kind),
           " is not a zero-bubble kind");
  Replan out;
  out.unit_s = out.replanned_s = simulate(unit, costs).makespan;
  const Schedule greedy = make_schedule(kind, unit.layout.ranks, unit.micro_batches, unit.layout.chunks, costs);
  for (const Schedule* base : {&greedy, &unit})
    for (Schedule t : {compute_only(*base), fuse_where_faster(*base, costs)}) {
      const double x = simulate(t, costs).makespan;
      if (x < out.replanned_s && x < out.unit_s * (1 - gain)) {
        out.replanned_s = x;
        out.table = std::move(t);
      }
    }
  // The best of them (or the unit table) with its order searched, then its fusions again.
  const Schedule searched = fuse_where_faster(improve_order(out.better() ? out.table : unit, costs), costs);
  const double x = simulate(searched, costs).makespan;
  if (x < out.replanned_s * (1 - 1e-9) && x < out.unit_s * (1 - gain)) {
    out.replanned_s = x;
    out.table = searched;
  }
  return out;
}

Schedule improve_order(const Schedule& compute, const SimCosts& costs, const SearchLimits& lim) {
  Schedule s = compute_only(compute);
  const int slots = largest(peak_in_flight_per_chunk(s));
  const SimResult start = simulate(s, costs);
  RT_CHECK(!start.deadlock, "improve_order: the starting table deadlocks: ", start.where);
  double best = start.makespan;
  long played = 0;  // actions played in all
  long per_play = 0;
  for (const auto& o : lower(s).ranks) per_play += static_cast<long>(o.size());
  for (int pass = 0; pass < lim.passes && played < lim.budget; ++pass) {
    bool improved = false;
    for (std::size_t r = 0; r < s.ranks.size() && played < lim.budget; ++r) {
      const auto n = static_cast<std::ptrdiff_t>(s.ranks[r].size());
      for (std::ptrdiff_t from = 0; from < n && played < lim.budget; ++from)
        for (std::ptrdiff_t d = -lim.window; d <= lim.window && played < lim.budget; ++d) {
          const std::ptrdiff_t to = from + d;
          if (d == 0 || to < 0 || to >= n) continue;
          std::vector<Action> o = s.ranks[r];
          const Action a = o[static_cast<std::size_t>(from)];
          o.erase(o.begin() + from);
          o.insert(o.begin() + to, a);
          if (!rank_order_ok(o, s.layout, static_cast<int>(r))) continue;
          Schedule t = s;
          t.ranks[r] = std::move(o);
          if (largest(peak_in_flight_per_chunk(t)) > slots) continue;
          played += per_play;
          improved |= take_if_faster(s, t, costs, best);
        }
    }
    if (!improved) break;
  }
  return s;
}

}  // namespace ringtrain
