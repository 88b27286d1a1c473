// improve_order (simulator.hpp): the local search over each rank's order,
// against every order of small tables played (brute force), and on random
// costs never slower than where it starts, always a valid table within the
// executor's slots.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "ringtrain/parallel/simulator.hpp"

namespace ringtrain {
namespace {

SimCosts random_costs(const PipelineLayout& L, std::mt19937& g) {
  std::uniform_real_distribution<double> u(0.5, 2.0);
  SimCosts c;
  for (int s = 0; s < L.stages(); ++s) {
    const double f = u(g);
    c.stage.push_back({f, 0.6 * f * u(g), 0.5 * f * u(g), 1.9 * f});
  }
  c.link = {0.05, 0};
  return c;
}

int fullest_chunk(const Schedule& s) {
  int most = 0;
  for (const auto& r : peak_in_flight_per_chunk(s))
    for (int c : r) most = std::max(most, c);
  return most;
}

// Every order of one rank's actions in which each action's predecessors on
// that rank come first: its stage's previous micro-batch of the same kind,
// its own forward (for I, B) or I (for W), and the neighbouring stage's on
// this rank. Written from the rules, not from improve_order's check.
std::vector<std::vector<Action>> orders_of(const std::vector<Action>& acts, const PipelineLayout& L, int rank) {
  std::vector<std::vector<Action>> out;
  std::vector<Action> now;
  std::vector<bool> used(acts.size(), false);
  auto ran = [&](Op op, int stage, int mb) {
    for (const Action& a : now)
      if (a.stage == stage && a.mb == mb &&
          (a.op == op || (op == Op::backward_input && a.op == Op::backward)))
        return true;
    return false;
  };
  auto ready = [&](const Action& a) {
    const bool bwd = a.op == Op::backward || a.op == Op::backward_input;
    if (a.op == Op::forward) {
      if (a.mb > 0 && !ran(Op::forward, a.stage, a.mb - 1)) return false;
      return !(a.stage > 0 && L.rank_of(a.stage - 1) == rank && !ran(Op::forward, a.stage - 1, a.mb));
    }
    if (bwd) {
      if (!ran(Op::forward, a.stage, a.mb)) return false;
      if (a.mb > 0 && !ran(Op::backward_input, a.stage, a.mb - 1)) return false;
      return !(a.stage + 1 < L.stages() && L.rank_of(a.stage + 1) == rank &&
               !ran(Op::backward_input, a.stage + 1, a.mb));
    }
    return ran(Op::backward_input, a.stage, a.mb);  // W
  };
  std::function<void()> walk = [&] {
    if (now.size() == acts.size()) {
      out.push_back(now);
      return;
    }
    for (std::size_t k = 0; k < acts.size(); ++k)
      if (!used[k] && ready(acts[k])) {
        used[k] = true;
        now.push_back(acts[k]);
        walk();
        now.pop_back();
        used[k] = false;
      }
  };
  walk();
  return out;
}

// The fastest play over every combination of the ranks' orders that fits `slots`.
double best_of_every_order(const Schedule& start, const SimCosts& c) {
  const int slots = fullest_chunk(start);
  std::vector<std::vector<std::vector<Action>>> each;
  for (std::size_t r = 0; r < start.ranks.size(); ++r)
    each.push_back(orders_of(start.ranks[r], start.layout, static_cast<int>(r)));
  double best = 1e300;
  Schedule t = start;
  std::function<void(std::size_t)> pick = [&](std::size_t r) {
    if (r == each.size()) {
      if (fullest_chunk(t) > slots) return;
      const SimResult x = simulate(t, c);
      if (!x.deadlock) best = std::min(best, x.makespan);
      return;
    }
    for (const auto& o : each[r]) {
      t.ranks[r] = o;
      pick(r + 1);
    }
  };
  pick(0);
  return best;
}

// The table with every rank's W moved to its end, in their order: valid, and
// slower than need be where a W could fill a wait.
Schedule w_last(const Schedule& t) {
  Schedule s = t;
  for (auto& o : s.ranks)
    std::stable_partition(o.begin(), o.end(), [](const Action& a) { return a.op != Op::backward_weight; });
  return s;
}

// zb-h1 at p = 2, m = 3 and 4 and p = 3, m = 2 on random costs, every order
// of every rank played (up to 14 x 2575 pairs). From the table with every W
// last (slower than the best order in 21 of 45 cases, by up to 21%) the
// search reaches the best in 44 of 45, the other 0.5% over (measured);
// asserted: at least 40 exact, none over 5%.
TEST(TableSearch, ReachesTheBestOrderOfSmallTables) {
  std::mt19937 g(7);
  int exact = 0, cases = 0;
  for (auto [p, m] : {std::pair{2, 3}, std::pair{3, 2}, std::pair{2, 4}})
    for (int trial = 0; trial < 15; ++trial) {
      const Schedule start = w_last(make_schedule(ScheduleKind::zb_h1, p, m));
      const SimCosts c = random_costs(start.layout, g);
      const double best = best_of_every_order(start, c);
      const Schedule s = improve_order(start, c);
      ASSERT_NO_THROW(validate(s));
      const double got = simulate(s, c).makespan;
      EXPECT_GE(got, best * (1 - 1e-9));
      EXPECT_LE(got, best * 1.05) << "p = " << p << ", trial " << trial;
      exact += got <= best * (1 + 1e-9);
      ++cases;
    }
  EXPECT_GE(exact, 40) << exact << " of " << cases;
}

// Larger tables on random costs (zb-h1 and zb-v, p = 2 and 4, m = 4 and 8):
// valid, within the starting table's slots, never slower than the start (the
// zero-bubble greedy over the costs, where replan_zero_bubble starts) nor
// faster than the busiest rank; 0.7% faster on average (measured; asserted:
// more than 0.2%); replan_zero_bubble's pick at least as fast as the greedy's.
TEST(TableSearch, NeverSlowerThanItsStartAndAlwaysValid) {
  std::mt19937 g(11);
  double gained = 0;
  int cases = 0;
  for (auto kind : {ScheduleKind::zb_h1, ScheduleKind::zb_v})
    for (int p : {2, 4})
      for (int m : {4, 8}) {
        const Schedule unit = make_schedule(kind, p, m);
        const SimCosts c = random_costs(unit.layout, g);
        const Schedule start = make_schedule(kind, p, m, unit.layout.chunks, c);
        const Schedule s = improve_order(start, c);
        ASSERT_NO_THROW(validate(s));
        EXPECT_LE(fullest_chunk(s), fullest_chunk(start));
        const double before = simulate(start, c).makespan, after = simulate(s, c).makespan;
        EXPECT_LE(after, before * (1 + 1e-9));
        EXPECT_GE(after, busiest_rank_s(s, c) * (1 - 1e-9));
        gained += 1 - after / before;
        ++cases;
        const Replan r = replan_zero_bubble(unit, kind, c);
        if (r.better()) {
          EXPECT_LE(r.replanned_s, simulate(fuse_where_faster(start, c), c).makespan * (1 + 1e-9));
        }
      }
  EXPECT_GT(gained / cases, 0.002) << "the search moved nothing";
}

}  // namespace
}  // namespace ringtrain
