// Every generated schedule, checked offline against an independent model of
// the executor: receives block until the matching send ran, sends never block
// (the executor posts all receives of a step at its start).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "ringtrain/core/error.hpp"
#include "ringtrain/parallel/schedule.hpp"

namespace ringtrain {
namespace {

const ScheduleKind kKinds[] = {ScheduleKind::afab, ScheduleKind::one_f_one_b, ScheduleKind::zb_h1};

// Each stage's list on its own: counts, order and framing of every micro-batch.
void check_stage(const std::vector<Instr>& s, int p, int m, int stage, const std::string& what) {
  const bool first = stage == 0, last = stage == p - 1;
  std::map<Op, std::vector<int>> seen;
  std::vector<int> pos_f(m, -1), pos_b(m, -1), pos_w(m, -1);
  ASSERT_GE(s.size(), 2u) << what;
  for (std::size_t k = 0; k < s.size(); ++k) {
    const Instr& i = s[k];
    seen[i.op].push_back(i.mb);
    ASSERT_TRUE(i.mb >= 0 && i.mb < m) << what;
    if (i.op == Op::forward) {
      pos_f[i.mb] = static_cast<int>(k);
      ASSERT_GT(k, 0u);
      EXPECT_EQ(s[k - 1], (Instr{first ? Op::load_micro_batch : Op::recv_act, i.mb})) << what << " F" << i.mb;
      if (!last) { EXPECT_EQ(s[k + 1], (Instr{Op::send_act, i.mb})) << what << " F" << i.mb; }
    }
    if (i.op == Op::backward_input) {
      pos_b[i.mb] = static_cast<int>(k);
      if (!last) { EXPECT_EQ(s[k - 1], (Instr{Op::recv_grad, i.mb})) << what << " B" << i.mb; }
      const std::size_t after = s[k + 1].op == Op::backward_weight ? k + 2 : k + 1;
      if (!first) { EXPECT_EQ(s[after], (Instr{Op::send_grad, i.mb})) << what << " B" << i.mb; }
    }
    if (i.op == Op::backward_weight) pos_w[i.mb] = static_cast<int>(k);
  }
  for (Op op : {Op::forward, Op::backward_input, Op::backward_weight}) {
    auto v = seen[op];
    std::sort(v.begin(), v.end());
    ASSERT_EQ(static_cast<int>(v.size()), m) << what << " " << op_name(op);
    for (int i = 0; i < m; ++i) EXPECT_EQ(v[i], i) << what << " " << op_name(op) << " not exactly once";
  }
  EXPECT_EQ(seen[Op::load_micro_batch].size(), first ? std::size_t(m) : 0u) << what;
  EXPECT_EQ(seen[Op::recv_act].size(), first ? 0u : std::size_t(m)) << what;
  EXPECT_EQ(seen[Op::send_act].size(), last ? 0u : std::size_t(m)) << what;
  EXPECT_EQ(seen[Op::recv_grad].size(), last ? 0u : std::size_t(m)) << what;
  EXPECT_EQ(seen[Op::send_grad].size(), first ? 0u : std::size_t(m)) << what;
  for (int i = 0; i < m; ++i) {
    EXPECT_LT(pos_f[i], pos_b[i]) << what << " mb " << i;
    EXPECT_LT(pos_b[i], pos_w[i]) << what << " mb " << i;
  }
}

struct SimResult {
  bool deadlock = false;
  std::string where;
  double makespan = 0;
  std::vector<double> busy;
};

// Runs the p lists against each other. Each stage executes its next
// instruction as soon as it can; compute ops take tf/tb/tw, communication is
// free; a receive waits until the message's send has run.
SimResult simulate(const std::vector<std::vector<Instr>>& lists, double tf, double tb, double tw) {
  const int p = static_cast<int>(lists.size());
  SimResult r;
  r.busy.assign(p, 0);
  std::vector<std::size_t> pc(p, 0);
  std::vector<double> clock(p, 0);
  std::map<std::tuple<int, int, int>, double> sent;  // (to stage, kind, mb) -> time sent
  for (;;) {
    bool moved = false, all = true;
    for (int s = 0; s < p; ++s) {
      while (pc[s] < lists[s].size()) {
        const Instr& i = lists[s][pc[s]];
        double dur = 0;
        if (i.op == Op::recv_act || i.op == Op::recv_grad) {
          auto it = sent.find({s, i.op == Op::recv_act ? 0 : 1, i.mb});
          if (it == sent.end()) break;  // blocked
          clock[s] = std::max(clock[s], it->second);
        } else if (i.op == Op::send_act) {
          sent[{s + 1, 0, i.mb}] = clock[s];
        } else if (i.op == Op::send_grad) {
          sent[{s - 1, 1, i.mb}] = clock[s];
        } else if (i.op == Op::forward) dur = tf;
        else if (i.op == Op::backward_input) dur = tb;
        else if (i.op == Op::backward_weight) dur = tw;
        clock[s] += dur;
        r.busy[s] += dur;
        ++pc[s];
        moved = true;
      }
      all &= pc[s] == lists[s].size();
    }
    if (all) break;
    if (!moved) {
      r.deadlock = true;
      for (int s = 0; s < p; ++s)
        if (pc[s] < lists[s].size())
          r.where += cat(" stage ", s, " waits in ", op_name(lists[s][pc[s]].op), " ", lists[s][pc[s]].mb, ";");
      return r;
    }
  }
  r.makespan = *std::max_element(clock.begin(), clock.end());
  return r;
}

TEST(Schedule, EveryScheduleIsCompleteOrderedPairedAndDeadlockFree) {
  for (ScheduleKind kind : kKinds)
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 32; ++m) {
        std::vector<std::vector<Instr>> lists;
        for (int s = 0; s < p; ++s) {
          lists.push_back(make_schedule(kind, p, m, s));
          std::string what = cat(schedule_name(kind), " p=", p, " m=", m, " stage ", s);
          check_stage(lists.back(), p, m, s, what);
          if (testing::Test::HasFailure()) return;
          const int peak = peak_in_flight(lists.back());
          if (kind == ScheduleKind::afab) {
            EXPECT_EQ(peak, m) << what;
          } else if (kind == ScheduleKind::one_f_one_b) {
            EXPECT_LE(peak, std::min(p - s, m)) << what << ": " << schedule_str(lists.back());
          } else {
            EXPECT_LE(peak, std::min(p, m)) << what << ": " << schedule_str(lists.back());
          }
        }
        SimResult r = simulate(lists, 1, 1, 1);
        ASSERT_FALSE(r.deadlock) << schedule_name(kind) << " p=" << p << " m=" << m << " deadlocks:" << r.where;
      }
}

// With unit F and B+W = 2 the AFAB and 1F1B makespan is the textbook
// 3(m + p - 1), i.e. bubble (p-1)/(m+p-1) on every stage.
TEST(Schedule, AfabAnd1f1bBubbleMatchesTheFormula) {
  for (ScheduleKind kind : {ScheduleKind::afab, ScheduleKind::one_f_one_b})
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 32; ++m) {
        std::vector<std::vector<Instr>> lists;
        for (int s = 0; s < p; ++s) lists.push_back(make_schedule(kind, p, m, s));
        SimResult r = simulate(lists, 1, 1, 1);
        EXPECT_DOUBLE_EQ(r.makespan, 3.0 * (m + p - 1)) << schedule_name(kind) << " p=" << p << " m=" << m;
        EXPECT_NEAR(1 - r.busy[0] / r.makespan, analytic_bubble(kind, p, m), 1e-12);
      }
}

// ZB-H1 (Qi et al.): with T_F = T_B = T_W the bubble is (p-1)(T_F+T_B-T_W)
// = p - 1 time units, a third of 1F1B's 3(p-1); our greedy reaches it
// exactly for every m >= p.
TEST(Schedule, ZeroBubbleH1MeetsThePapersBubble) {
  for (int p = 2; p <= 8; ++p)
    for (int m = 1; m <= 32; ++m) {
      std::vector<std::vector<Instr>> lists;
      for (int s = 0; s < p; ++s) lists.push_back(make_schedule(ScheduleKind::zb_h1, p, m, s));
      SimResult r = simulate(lists, 1, 1, 1);
      const double paper = 3.0 * m + (p - 1);
      if (m >= p) { EXPECT_DOUBLE_EQ(r.makespan, paper) << "p=" << p << " m=" << m << ": " << schedule_str(lists[0]); }
      EXPECT_LT(r.makespan, 3.0 * (m + p - 1)) << "p=" << p << " m=" << m << " not better than 1F1B";
    }
}

TEST(Schedule, ListsLookLikeThePapers) {
  EXPECT_EQ(schedule_str(make_schedule(ScheduleKind::one_f_one_b, 4, 6, 0)),
            "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5");
  // The last stage runs B ahead of W while upstream stages wait for it.
  EXPECT_EQ(schedule_str(make_schedule(ScheduleKind::zb_h1, 2, 3, 1)), "F0 B0 F1 B1 W0 F2 B2 W1 W2");
  EXPECT_EQ(schedule_str(make_schedule(ScheduleKind::one_f_one_b, 4, 6, 3)),
            "F0 B0 W0 F1 B1 W1 F2 B2 W2 F3 B3 W3 F4 B4 W4 F5 B5 W5");
  EXPECT_EQ(schedule_str(make_schedule(ScheduleKind::afab, 2, 2, 1)), "F0 F1 B0 W0 B1 W1");
}

TEST(Schedule, BadArgumentsAreErrors) {
  EXPECT_THROW(make_schedule(ScheduleKind::afab, 0, 4, 0), Error);
  EXPECT_THROW(make_schedule(ScheduleKind::afab, 2, 0, 0), Error);
  EXPECT_THROW(make_schedule(ScheduleKind::afab, 2, 4, 2), Error);
  EXPECT_THROW(parse_schedule("interleaved"), Error);
  EXPECT_EQ(parse_schedule("zb-h1"), ScheduleKind::zb_h1);
}

}  // namespace
}  // namespace ringtrain
