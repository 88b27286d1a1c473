// Every generated schedule table, checked offline against an independent
// model of the executor (receives block until the matching send ran, sends
// never block: the executor posts all receives of a step at its start), and
// the library's validator, simulator and file format against hand-made cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include "ringtrain/core/error.hpp"
#include "ringtrain/parallel/schedule.hpp"
#include "ringtrain/parallel/simulator.hpp"

namespace ringtrain {
namespace {

// Each rank's lowered list on its own: counts, order and framing of every (stage, micro-batch).
void check_rank(const Schedule& low, int r, const std::string& what) {
  const PipelineLayout& L = low.layout;
  const int S = L.stages(), m = low.micro_batches;
  const auto& s = low.ranks[static_cast<std::size_t>(r)];
  std::map<std::tuple<Op, int, int>, int> pos;
  for (std::size_t k = 0; k < s.size(); ++k) {
    const Action& a = s[k];
    ASSERT_EQ(L.rank_of(a.stage), r) << what << " " << action_str(a);
    ASSERT_TRUE(pos.emplace(std::tuple{a.op, a.stage, a.mb}, static_cast<int>(k)).second) << what << " twice";
    const bool remote_prev = a.stage > 0 && L.rank_of(a.stage - 1) != r;
    const bool remote_next = a.stage + 1 < S && L.rank_of(a.stage + 1) != r;
    if (a.op == Op::forward) {
      ASSERT_GT(k, 0u) << what;
      if (a.stage == 0) EXPECT_EQ(s[k - 1], (Action{Op::load_micro_batch, 0, a.mb})) << what;
      if (remote_prev) EXPECT_EQ(s[k - 1], (Action{Op::recv_act, a.stage, a.mb})) << what;
      if (remote_next) EXPECT_EQ(s[k + 1], (Action{Op::send_act, a.stage, a.mb})) << what;
    }
    if (a.op == Op::backward || a.op == Op::backward_input) {
      if (remote_next) EXPECT_EQ(s[k - 1], (Action{Op::recv_grad, a.stage, a.mb})) << what;
      if (remote_prev) EXPECT_EQ(s[k + 1], (Action{Op::send_grad, a.stage, a.mb})) << what;
    }
  }
  for (int g = 0; g < S; ++g) {
    if (L.rank_of(g) != r) continue;
    for (int i = 0; i < m; ++i) {
      auto at = [&](Op op) {
        auto it = pos.find({op, g, i});
        return it == pos.end() ? -1 : it->second;
      };
      const int f = at(Op::forward), b = at(Op::backward), in = at(Op::backward_input), w = at(Op::backward_weight);
      ASSERT_GE(f, 0) << what << " stage " << g << " mb " << i << " never forwarded";
      ASSERT_TRUE((b >= 0) != (in >= 0)) << what << " stage " << g << " mb " << i << ": one backward";
      if (b >= 0) EXPECT_LT(f, b) << what;
      if (in >= 0) {
        EXPECT_LT(f, in) << what;
        EXPECT_LT(in, w) << what << " stage " << g << " mb " << i;
      }
    }
  }
}

struct Play {
  bool deadlock = false;
  double makespan = 0;
  std::vector<double> busy;
};

// The executor's model, written apart from the library's simulate(): F = 1,
// I = W = 1, B = 2 per chunk; messages free.
Play play(const Schedule& low) {
  const int p = low.layout.ranks;
  Play r;
  r.busy.assign(p, 0);
  std::vector<std::size_t> pc(p, 0);
  std::vector<double> clock(p, 0);
  std::map<std::tuple<int, int, int>, double> sent;  // (to stage, kind, mb) -> time
  for (;;) {
    bool moved = false, all = true;
    for (int k = 0; k < p; ++k) {
      const auto& list = low.ranks[k];
      while (pc[k] < list.size()) {
        const Action& a = list[pc[k]];
        double dur = 0;
        if (a.op == Op::recv_act || a.op == Op::recv_grad) {
          auto it = sent.find({a.stage, a.op == Op::recv_act ? 0 : 1, a.mb});
          if (it == sent.end()) break;
          clock[k] = std::max(clock[k], it->second);
        } else if (a.op == Op::send_act) {
          sent[{a.stage + 1, 0, a.mb}] = clock[k];
        } else if (a.op == Op::send_grad) {
          sent[{a.stage - 1, 1, a.mb}] = clock[k];
        } else if (a.op == Op::backward) {
          dur = 2;
        } else if (is_compute(a.op)) {
          dur = 1;
        }
        clock[k] += dur;
        r.busy[k] += dur;
        ++pc[k];
        moved = true;
      }
      all &= pc[k] == list.size();
    }
    if (all) break;
    if (!moved) {
      r.deadlock = true;
      return r;
    }
  }
  r.makespan = *std::max_element(clock.begin(), clock.end());
  return r;
}

struct Case {
  ScheduleKind kind;
  int v;
};
const Case kCases[] = {{ScheduleKind::afab, 1},        {ScheduleKind::one_f_one_b, 1}, {ScheduleKind::zb_h1, 1},
                       {ScheduleKind::interleaved, 2}, {ScheduleKind::interleaved, 3}, {ScheduleKind::zb_v, 2}};

bool runs(const Case& c, int p, int m) { return c.kind != ScheduleKind::interleaved || m % p == 0; }

TEST(Schedule, EveryTableIsCompleteOrderedFramedAndDeadlockFree) {
  for (const Case& c : kCases)
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 32; ++m) {
        if (!runs(c, p, m)) continue;
        const std::string what = cat(schedule_name(c.kind), " v=", c.v, " p=", p, " m=", m);
        const Schedule s = make_schedule(c.kind, p, m, c.v);
        ASSERT_NO_THROW(validate(s)) << what;
        const Schedule low = lower(s);
        EXPECT_EQ(lower(low).ranks, low.ranks) << what << ": lowering twice changes it";
        for (int r = 0; r < p; ++r) check_rank(low, r, cat(what, " rank ", r));
        if (testing::Test::HasFailure()) return;
        const Play pl = play(low);
        ASSERT_FALSE(pl.deadlock) << what;
        const SimResult sim = simulate(s);
        ASSERT_FALSE(sim.deadlock) << what;
        EXPECT_DOUBLE_EQ(sim.makespan, pl.makespan) << what << ": the library's simulator disagrees";
        const std::vector<int> peak = peak_in_flight(s);
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(sim.peak[r], peak[r]) << what;
          if (c.kind == ScheduleKind::afab) EXPECT_EQ(peak[r], m) << what;
          if (c.kind == ScheduleKind::one_f_one_b) EXPECT_LE(peak[r], std::min(p - r, m)) << what;
          if (c.kind == ScheduleKind::zb_h1) EXPECT_LE(peak[r], std::min(p, m)) << what;
          // ZB-V holds at most what 1F1B holds on its first stage: p micro-batches of 2 chunks.
          if (c.kind == ScheduleKind::zb_v) EXPECT_LE(peak[r], 2 * std::min(p, m)) << what;
        }
      }
}

// Unit F = I = W per chunk (B = 2): AFAB and 1F1B take 3(m + p - 1), i.e.
// bubble (p-1)/(m+p-1); interleaved 3vm + 3(p-1), bubble (p-1)/(vm+p-1)
// (Narayanan et al. 2021: the bubble divided by v).
TEST(Schedule, BubblesMatchTheFormulas) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 32; ++m) {
      for (ScheduleKind kind : {ScheduleKind::afab, ScheduleKind::one_f_one_b}) {
        const Play r = play(lower(make_schedule(kind, p, m)));
        EXPECT_DOUBLE_EQ(r.makespan, 3.0 * (m + p - 1)) << schedule_name(kind) << " p=" << p << " m=" << m;
        EXPECT_NEAR(1 - r.busy[0] / r.makespan, analytic_bubble(kind, p, m), 1e-12);
      }
      for (int v : {2, 3}) {
        if (m % p != 0) continue;
        const Play r = play(lower(make_schedule(ScheduleKind::interleaved, p, m, v)));
        EXPECT_DOUBLE_EQ(r.makespan, 3.0 * v * m + 3.0 * (p - 1)) << "interleaved v=" << v << " p=" << p << " m=" << m;
        EXPECT_NEAR(1 - r.busy[0] / r.makespan, analytic_bubble(ScheduleKind::interleaved, p, m, 1, 1, 1, v), 1e-12);
      }
    }
}

// ZB-H1 (Qi et al.): with T_F = T_B = T_W the bubble is p - 1 units, a third
// of 1F1B's 3(p-1); the greedy reaches it for every m >= p. ZB-V, in the
// same units (a chunk half a stage), does at least as well at the same memory.
TEST(Schedule, ZeroBubbleSchedulesMeetThePapers) {
  for (int p = 2; p <= 8; ++p)
    for (int m = 1; m <= 32; ++m) {
      const Schedule h1 = make_schedule(ScheduleKind::zb_h1, p, m);
      const Play r = play(lower(h1));
      if (m >= p) EXPECT_DOUBLE_EQ(r.makespan, 3.0 * m + (p - 1)) << "p=" << p << " m=" << m;
      EXPECT_LT(r.makespan, 3.0 * (m + p - 1)) << "p=" << p << " m=" << m << " not better than 1F1B";
      SimCosts half;
      half.stage.assign(static_cast<std::size_t>(2 * p), StageCost{0.5, 0.5, 0.5});
      const SimResult v = simulate(make_schedule(ScheduleKind::zb_v, p, m), half);
      if (m >= p) EXPECT_LE(v.makespan, r.makespan) << "p=" << p << " m=" << m;
      if (m >= 2 * p) EXPECT_LT(v.mean_bubble(), 1 - (3.0 * m) / r.makespan) << "p=" << p << " m=" << m;
    }
}

TEST(Schedule, TablesLookLikeThePapers) {
  auto row = [](const Schedule& s, int r) {
    std::string out;
    for (const Action& a : s.ranks[r]) out += (out.empty() ? "" : " ") + action_str(a);
    return out;
  };
  EXPECT_EQ(row(make_schedule(ScheduleKind::one_f_one_b, 4, 6), 0),
            "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5");
  // The last stage runs I ahead of W while upstream stages wait for it.
  EXPECT_EQ(row(make_schedule(ScheduleKind::zb_h1, 2, 3), 1), "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1W2");
  // The first stage sends no input gradient: where its W follows its I at once, one whole B runs instead.
  EXPECT_EQ(row(make_schedule(ScheduleKind::zb_h1, 2, 4), 0), "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3");
  // ZB-V's rank 0 keeps its last free activation for stage 3 (0F3 waits until 0W0).
  EXPECT_EQ(row(make_schedule(ScheduleKind::zb_v, 2, 4), 0), "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 0I0 3W1 0I1 0W0 0F3 "
                                                             "3F2 3I2 3W2 0W1 3F3 3I3 0I2 3W3 0I3 0W2 0W3");
  EXPECT_EQ(row(make_schedule(ScheduleKind::afab, 2, 2), 1), "1F0 1F1 1B0 1B1");
  // Megatron's interleaved order at p = 2, v = 2, m = 4: rounds of p micro-batches per chunk.
  EXPECT_EQ(row(make_schedule(ScheduleKind::interleaved, 2, 4, 2), 0),
            "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
  // The V: rank 0 holds the first and the last stage.
  const Schedule v = make_schedule(ScheduleKind::zb_v, 2, 2);
  EXPECT_EQ(v.layout.rank_of(0), 0);
  EXPECT_EQ(v.layout.rank_of(3), 0);
  EXPECT_EQ(v.layout.rank_of(1), 1);
  EXPECT_EQ(v.layout.rank_of(2), 1);
  // Stage 1 to 2 hands over in memory; 2 to 3 goes back to rank 0.
  EXPECT_EQ(row(lower(v), 1), "RecvAct(1,0) 1F0 2F0 SendAct(2,0) RecvAct(1,1) 1F1 2F1 SendAct(2,1) RecvGrad(2,0) 2I0 "
                              "1I0 SendGrad(1,0) RecvGrad(2,1) 2I1 1I1 SendGrad(1,1) 2W0 2W1 1W0 1W1");
  // One column per time unit (a B spans two); 3(m + p - 1) = 9 units.
  EXPECT_EQ(schedule_table(make_schedule(ScheduleKind::one_f_one_b, 2, 2)),
            "rank 0 | 0F0 0F1 .   .   0B0     .   0B1    \n"
            "rank 1 | .   1F0 1B0     1F1 1B1     .   .  \n");
}

Schedule two_rank(std::vector<Action> r0, std::vector<Action> r1, int m) {
  Schedule s;
  s.layout = {2, 1, ChunkPlacement::loop};
  s.micro_batches = m;
  s.ranks = {std::move(r0), std::move(r1)};
  return s;
}

void expect_error(const Schedule& s, const std::string& part) {
  try {
    validate(s);
    ADD_FAILURE() << "accepted; expected an error naming '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Schedule, TheValidatorNamesWhatIsWrong) {
  using A = Action;
  const Op F = Op::forward, B = Op::backward, I = Op::backward_input, W = Op::backward_weight;
  // Each rank alone is fine, together they wait for each other.
  expect_error(two_rank({A{F, 0, 0}, A{B, 0, 0}, A{F, 0, 1}, A{B, 0, 1}},
                        {A{F, 1, 1}, A{B, 1, 1}, A{F, 1, 0}, A{B, 1, 0}}, 2),
               "deadlock: rank 0 waits in RecvGrad(0,0); rank 1 waits in RecvAct(1,1)");
  expect_error(two_rank({A{F, 0, 0}, A{B, 0, 0}}, {A{F, 1, 0}}, 1), "rank 1 never runs a backward of stage 1");
  expect_error(two_rank({A{B, 0, 0}, A{F, 0, 0}}, {A{F, 1, 0}, A{B, 1, 0}}, 1), "0B0: comes before its forward");
  expect_error(two_rank({A{F, 0, 0}, A{B, 0, 0}}, {A{F, 1, 0}, A{W, 1, 0}, A{I, 1, 0}}, 1),
               "1W0: comes before its input gradient");
  expect_error(two_rank({A{F, 0, 0}, A{B, 0, 0}, A{F, 1, 0}}, {A{F, 1, 0}, A{B, 1, 0}}, 1),
               "rank 0, action 1F0: stage 1 is held by rank 1");
  expect_error(two_rank({A{F, 0, 0}, A{B, 0, 0}}, {A{F, 1, 0}, A{B, 1, 0}, A{F, 1, 2}}, 2), "micro-batch 2 is not in");
  EXPECT_NO_THROW(validate(two_rank({A{F, 0, 0}, A{B, 0, 0}}, {A{F, 1, 0}, A{I, 1, 0}, A{W, 1, 0}}, 1)));
  // A V layout whose rank runs its second stage before its first.
  Schedule v = make_schedule(ScheduleKind::zb_v, 2, 1);
  auto& r1 = v.ranks[1];
  std::swap(r1[0], r1[1]);  // 2F0 before 1F0
  expect_error(v, "runs before 1F0 on the same rank");
}

TEST(Schedule, TablesRoundTripThroughTheFileFormat) {
  const std::string path = testing::TempDir() + "schedule_roundtrip.csv";
  for (const Case& c : kCases) {
    const Schedule s = make_schedule(c.kind, 4, 8, c.v);
    {
      std::ofstream(path) << schedule_csv(s);
    }
    const Schedule back = read_schedule_csv(path, 4);
    EXPECT_EQ(back.layout, s.layout) << schedule_name(c.kind);
    EXPECT_EQ(back.micro_batches, 8);
    EXPECT_EQ(back.ranks, s.ranks) << schedule_name(c.kind);
  }
  auto fails = [&](const std::string& text, int p, const std::string& part) {
    {
      std::ofstream(path) << text;
    }
    try {
      read_schedule_csv(path, p);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  fails("0F0,0B0\n1F0,1X0\n", 2, ":2: cell 2 '1X0' is not an action");
  fails("0F0,0B0\n", 2, "1 rank lines, the pipeline has parallel.pipeline = 2");
  fails("# comment\n0F0, 0B0\n1F0 1B0 2F0\n", 2, "stages 0..2 are not a multiple of 2 ranks");
  fails("0F0,0B0\n1B0,1F0\n", 2, "1B0: comes before its forward");
  EXPECT_THROW(read_schedule_csv(path + ".missing", 2), Error);
  std::remove(path.c_str());
}

PlanInput plan(std::vector<double> costs, int p, int m, bool uniform = true) {
  PlanInput in;
  in.layer_costs = std::move(costs);
  in.ranks = p;
  in.micro_batches = m;
  in.uniform_cut = uniform;
  return in;
}

// parallel.schedule = auto: the fastest predicted of those holding no more
// activations than 1F1B (interleaved holds more: never picked).
TEST(Schedule, AutoPicksTheFastestThatFitsTheMemory) {
  std::string why;
  EXPECT_EQ(pick_schedule(plan(std::vector<double>(8, 1.0), 2, 8), &why), ScheduleKind::zb_v) << why;
  EXPECT_NE(why.find("interleaved"), std::string::npos) << why;
  EXPECT_NE(why.find("(more activations than 1f1b)"), std::string::npos) << why;
  // 3 layers cannot make 4 chunks: of the rest, ZB-H1's bubble is smaller.
  why.clear();
  EXPECT_EQ(pick_schedule(plan(std::vector<double>(3, 1.0), 2, 8), &why), ScheduleKind::zb_h1);
  EXPECT_NE(why.find("zb-v left out: 4 chunks, the model has 3 layers"), std::string::npos) << why;
  // One rank: every schedule takes 3m, and a tie keeps 1F1B.
  EXPECT_EQ(pick_schedule(plan(std::vector<double>(4, 1.0), 1, 4)), ScheduleKind::one_f_one_b);
  // The cut decides: a uniform cut of one heavy layer and three light ones leaves
  // the heavy stage the bottleneck for every schedule; a cost cut lets the V balance.
  const std::vector<double> skew = {1, 1, 1, 3};
  std::string u, c;
  pick_schedule(plan(skew, 2, 8, true), &u);
  pick_schedule(plan(skew, 2, 8, false), &c);
  EXPECT_NE(u, c);
  EXPECT_THROW(make_schedule(ScheduleKind::automatic, 2, 4), Error);
  EXPECT_EQ(parse_schedule("auto"), ScheduleKind::automatic);
}

// A synthetic cost table with messages: auto's pick is, among the schedules
// that fit 1F1B's memory, the one the simulator (played here on stages cut by
// hand) predicts fastest; a schedule that is faster but holds more (here
// interleaved at m = 2p) is left out; and expensive messages change the pick.
TEST(Schedule, AutoPicksWhatTheSimulatorSaysWithMessagesAndMemory) {
  // 8 layers (forward + backward seconds of one micro-batch), their outputs'
  // bytes (all rendezvous-sized), p = 2, m = 4.
  PlanInput in = plan({0.03, 0.03, 0.03, 0.03, 0.03, 0.03, 0.03, 0.03}, 2, 4);
  in.layer_out_bytes.assign(8, 1e6);
  auto by_hand = [&](ScheduleKind k) {  // the simulator on the stages the plan cuts: 8 / S layers each
    const PipelineLayout L = layout_for(k, 2, 2);
    const double t = 0.03 * (8 / L.stages());
    SimCosts c;
    c.stage.assign(static_cast<std::size_t>(L.stages()), StageCost{t / 3, t / 3, t / 3});
    c.boundary_bytes.assign(static_cast<std::size_t>(L.stages()), 1e6);
    c.link = in.link;
    return simulate(make_schedule(k, 2, 4, 2), c);
  };
  const ScheduleKind fitting[] = {ScheduleKind::one_f_one_b, ScheduleKind::zb_h1, ScheduleKind::zb_v};
  for (const LinkCost link : {LinkCost{0, 0}, LinkCost{2e-3, 1e9}, LinkCost{20e-3, 1e9}}) {
    in.link = link;
    ScheduleKind best = ScheduleKind::one_f_one_b;
    for (ScheduleKind k : fitting)
      if (by_hand(k).makespan < by_hand(best).makespan * (1 - 1e-9)) best = k;
    std::string why;
    EXPECT_EQ(pick_schedule(in, &why), best) << "link " << link.latency_s << " s: " << why;
    // The plan's figures are the simulator's.
    for (const SchedulePrediction& x : predict_schedules(in)) {
      if (x.skipped.empty() && x.kind != ScheduleKind::afab) {
        EXPECT_DOUBLE_EQ(x.step, by_hand(x.kind).makespan) << schedule_name(x.kind);
      }
    }
    // Interleaved holds 2.5 stage micro-batches against 1F1B's 2: never picked,
    // even where it is predicted fastest.
    const std::vector<SchedulePrediction> all = predict_schedules(in);
    const auto il = std::find_if(all.begin(), all.end(), [](auto& x) { return x.kind == ScheduleKind::interleaved; });
    ASSERT_NE(il, all.end());
    EXPECT_FALSE(il->fits);
    EXPECT_NE(pick_schedule(in), ScheduleKind::interleaved);
  }
  // Free messages: ZB-V wins; at 20 ms a message (ZB-V's 4 crossings per
  // micro-batch against ZB-H1's 2), ZB-V no longer does.
  in.link = {};
  EXPECT_EQ(pick_schedule(in), ScheduleKind::zb_v);
  in.link = {20e-3, 1e9};
  EXPECT_NE(pick_schedule(in), ScheduleKind::zb_v);
  // Interleaved predicted fastest but over the memory: with a table where it
  // is, the pick is still one that fits.
  PlanInput il = plan(std::vector<double>(8, 0.03), 2, 4);
  il.kinds = {ScheduleKind::one_f_one_b, ScheduleKind::interleaved};
  const std::vector<SchedulePrediction> two = predict_schedules(il);
  ASSERT_LT(two[1].step, two[0].step);  // faster...
  EXPECT_FALSE(two[1].fits);           // ...but holds more
}

TEST(Schedule, BadArgumentsAreErrors) {
  EXPECT_THROW(make_schedule(ScheduleKind::afab, 0, 4), Error);
  EXPECT_THROW(make_schedule(ScheduleKind::afab, 2, 0), Error);
  EXPECT_THROW(make_schedule(ScheduleKind::interleaved, 2, 4, 1), Error);
  try {
    make_schedule(ScheduleKind::interleaved, 4, 6, 2);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be a multiple of 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_schedule("interleaved-2"), Error);
  EXPECT_EQ(parse_schedule("zb-h1"), ScheduleKind::zb_h1);
  EXPECT_EQ(parse_schedule("interleaved"), ScheduleKind::interleaved);
  EXPECT_EQ(parse_schedule("zb-v"), ScheduleKind::zb_v);
  EXPECT_EQ(parse_schedule("my/table.csv"), ScheduleKind::file);
}


// The zero-bubble greedy over any costs (zero W, slow stages, costly
// messages) yields valid tables that never deadlock, with at most 1F1B's
// activations per rank (p stage micro-batches).
TEST(Schedule, ZeroBubbleGreedyOverAnyCostsIsValid) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> u01(0, 1);
  auto u = [&] { return u01(gen); };
  for (ScheduleKind k : {ScheduleKind::zb_h1, ScheduleKind::zb_v})
    for (int p = 2; p <= 6; ++p)
      for (int m = 1; m <= 12; ++m)
        for (int trial = 0; trial < 4; ++trial) {
          const PipelineLayout L = layout_for(k, p, 2);
          SimCosts c;
          for (int g = 0; g < L.stages(); ++g)
            c.stage.push_back(StageCost{0.1 + 3 * u(), 0.1 + 3 * u(), trial == 0 ? 0.0 : 2 * u()});
          c.link = {trial == 3 ? 2.0 : 0.0, 0};
          const std::string what = cat(schedule_name(k), " p=", p, " m=", m, " trial ", trial);
          Schedule s;
          ASSERT_NO_THROW(s = make_schedule(k, p, m, 2, c)) << what;
          ASSERT_NO_THROW(validate(s)) << what;
          const SimResult r = simulate(s, c);
          ASSERT_FALSE(r.deadlock) << what << ": " << r.where;
          for (int peak : r.peak) EXPECT_LE(peak, p * L.chunks) << what;
        }
}

// vit's chunks as measured in one epoch of zb-v (ms per micro-batch, pipeline
// 2, m = 4, cut [2, 1, 1, 4]; forwards cost about I, W half of that): the
// table built over them plays 2.7% faster than the unit-cost one, and
// replan_zero_bubble takes it.
TEST(Schedule, TheGreedyOverMeasuredCostsBeatsTheUnitTable) {
  SimCosts c;
  c.stage = {{4.032, 4.392, 2.314}, {3.708, 4.277, 2.326}, {3.706, 4.157, 2.326}, {3.864, 4.403, 2.191}};
  c.link = {0.46, 0};
  const Schedule unit = make_schedule(ScheduleKind::zb_v, 2, 4);
  const double t_unit = simulate(unit, c).makespan;
  const double t_cost = simulate(make_schedule(ScheduleKind::zb_v, 2, 4, 2, c), c).makespan;
  EXPECT_LT(t_cost, 0.98 * t_unit) << t_cost << " vs " << t_unit;
  const Replan r = replan_zero_bubble(unit, ScheduleKind::zb_v, c);
  ASSERT_TRUE(r.better());
  EXPECT_DOUBLE_EQ(r.unit_s, t_unit);
  EXPECT_LE(r.replanned_s, t_cost);
  EXPECT_DOUBLE_EQ(simulate(r.table, c).makespan, r.replanned_s);
  // Where no candidate is 1% faster, nothing changes.
  EXPECT_FALSE(replan_zero_bubble(unit, ScheduleKind::zb_v, SimCosts{}).better());
}

// A split backward costs more than a whole one (vit's last stage, measured:
// I 8.3 + W 4.2 ms against 10.5 whole; F 6.9; 0.4 ms messages; per chunk
// half of that). Fusing the backwards whose W fills no bubble takes ZB-V
// from 1.045x 1F1B's step to at least 1.10x (1.118x when found), and the
// table stays valid; with every backward whole, the order is the same.
TEST(Schedule, FusingTheBackwardsThatFillNoBubblePaysForTheSplit) {
  auto costs = [](const PipelineLayout& L) {
    SimCosts c;
    const double q = 1.0 / L.chunks;
    c.stage.assign(static_cast<std::size_t>(L.stages()), StageCost{6.9 * q, 8.3 * q, 4.2 * q, 10.5 * q});
    c.link = {0.4, 0};
    return c;
  };
  const Schedule f1b = make_schedule(ScheduleKind::one_f_one_b, 2, 4);
  const double t1 = simulate(f1b, costs(f1b.layout)).makespan;
  const Schedule v = make_schedule(ScheduleKind::zb_v, 2, 4);
  const SimCosts c = costs(v.layout);
  const double tv = simulate(v, c).makespan;
  EXPECT_NEAR(t1 / tv, 1.045, 0.005);
  const Schedule fused = fuse_where_faster(v, c);
  ASSERT_NO_THROW(validate(fused));
  const double tf = simulate(fused, c).makespan;
  EXPECT_GE(t1 / tf, 1.10) << tf;
  EXPECT_TRUE(fused.split_backward());  // some W still fill bubbles
  const Replan r = replan_zero_bubble(v, ScheduleKind::zb_v, c);
  ASSERT_TRUE(r.better());
  EXPECT_LE(r.replanned_s, tf);
  // fuse_all: each backward whole, the forwards and backwards in the same order.
  const Schedule all = fuse_all(v);
  ASSERT_NO_THROW(validate(all));
  EXPECT_FALSE(all.split_backward());
  for (std::size_t k = 0; k < v.ranks.size(); ++k) {
    std::vector<Action> expect;
    for (Action a : v.ranks[k]) {
      if (a.op == Op::backward_weight) continue;
      if (a.op == Op::backward_input) a.op = Op::backward;
      expect.push_back(a);
    }
    EXPECT_EQ(all.ranks[k], expect) << "rank " << k;
  }
}

// Each step played with its own costs (the epoch line's per-step prediction).
// 1F1B at p = 2, m = 2 (rank 0: F0 F1 B0 B1; rank 1: F0 B0 F1 B1), W = 0, free
// messages: with F = 1 on both stages and f1 + b1 >= f0 the step is
// max(f0 + f1 + b1 + 2 b0, f0 + 2 f1 + 2 b1 + b0), worked out by hand: 12 with
// stage 0's backward slow (b0 = 4, b1 = 2), 13 with stage 1's (b0 = 2, b1 = 4),
// and 12 for their mean costs (b0 = b1 = 3): the mean step, 12.5, is longer.
TEST(Schedule, MeanOfPerStepPlaysSeesTheSlowStageMove) {
  const Schedule s = make_schedule(ScheduleKind::one_f_one_b, 2, 2);
  auto costs = [](double b0, double b1) {
    SimCosts c;
    c.stage = {StageCost{1, b0, 0}, StageCost{1, b1, 0}};
    return c;
  };
  EXPECT_DOUBLE_EQ(simulate(s, costs(4, 2)).makespan, 12);
  EXPECT_DOUBLE_EQ(simulate(s, costs(2, 4)).makespan, 13);
  EXPECT_DOUBLE_EQ(simulate(s, costs(3, 3)).makespan, 12);
  EXPECT_DOUBLE_EQ(mean_makespan(s, {costs(4, 2), costs(2, 4)}), 12.5);
  EXPECT_DOUBLE_EQ(mean_makespan(s, {costs(3, 3)}), 12);
  EXPECT_EQ(mean_makespan(s, {}), 0);
}

}  // namespace
}  // namespace ringtrain
