// The simulator's messages against hand-worked timelines: each boundary's
// time, the V's turn in memory, and Open MPI's rendezvous (the sender's send
// completes when the receiver has taken it; the receiver copies the bytes).
#include <gtest/gtest.h>

#include <string>

#include "ringtrain/parallel/schedule.hpp"
#include "ringtrain/parallel/simulator.hpp"

namespace ringtrain {
namespace {

// The sender's side (simulator.hpp): a rendezvous send completes when the
// receiver has taken the message, and the executor waits for it before the
// slot's next forward and at the step's end. 1F1B, p = 2, m = 2, F = I = W = 1 per
// stage, one message d = 0.5 + 1000 B / (1000 B/s) = 1.5, by hand:
//   rank 0: F0 [0,1] F1 [1,2]; waits in RecvGrad0 from 2
//   rank 1: A0 arrives 1 + d; F0 B0 [1+d, 4+d]; sends G0 at 4 + d (rank 0
//           waits in MPI: it has G0 at 4 + 2d)
//           A1 arrived 2 + d; F1 needs the one slot, whose send G0 completes
//           when rank 0 has taken it: 4 + 2d (eager: F1 at 4 + d)
//           F1 B1 [4+2d, 7+2d]; G1 arrives 7 + 3d; rank 1 ends when rank 0 takes it, 7 + 3d
//   rank 0: B0 [4+2d, 6+2d]; B1 [7+3d, 9+3d]: step 9 + 3d (eager: 9 + 2d).
TEST(SimulatorMessages, SimulatorWaitsForRendezvousSendsAsTheExecutorDoes) {
  SimCosts c;
  c.link = {0.5, 1000};
  c.boundary_bytes = {1000, 0};
  c.eager_bytes = 100;  // 1000-byte messages go by rendezvous
  const Schedule s = make_schedule(ScheduleKind::one_f_one_b, 2, 2);
  const double d = 1.5;
  const SimResult r = simulate(s, c);
  ASSERT_FALSE(r.deadlock) << r.where;
  EXPECT_DOUBLE_EQ(r.makespan, 9 + 3 * d);
  ASSERT_EQ(r.started[1].size(), 4u);
  EXPECT_DOUBLE_EQ(r.started[1][2].first, 4 + 2 * d);  // rank 1's F1, after its send of G0 completed
  EXPECT_EQ(r.started[1][2].second, (Action{Op::forward, 1, 1}));
  EXPECT_DOUBLE_EQ(r.started[0][3].first, 7 + 3 * d);  // rank 0's B1
  EXPECT_DOUBLE_EQ(r.busy[0], 6);
  c.eager_bytes = 4096;  // the same messages eager: no sender wait
  const SimResult e = simulate(s, c);
  EXPECT_DOUBLE_EQ(e.makespan, 9 + 2 * d);
  EXPECT_DOUBLE_EQ(e.started[1][2].first, 4 + d);
}

// Messages cost latency + bytes / bandwidth, each boundary its own bytes;
// the makespans below are worked out by hand on the lowered tables (F = I =
// W = 1 per stage, B = 2; d = one message).
TEST(SimulatorMessages, SimulatorChargesEachMessageItsBoundarysTime) {
  // 1F1B, p = 2, m = 2 with d = 0.25 + 125 B / (100 B/s) = 1.5:
  //   rank 0: F0 [0,1] F1 [1,2]; its G0 arrives 4 + 2d, B0 to 6 + 2d; G1 arrives 7 + 2d, B1 to 9 + 2d
  //   rank 1: A0 arrives 1 + d, F0 B0 to 4 + d; F1 B1 to 7 + d.
  SimCosts c;
  c.link = {0.25, 100};
  c.boundary_bytes = {125, 0};
  const SimResult r = simulate(make_schedule(ScheduleKind::one_f_one_b, 2, 2), c);
  ASSERT_FALSE(r.deadlock);
  EXPECT_DOUBLE_EQ(r.makespan, 9 + 2 * 1.5);
  EXPECT_DOUBLE_EQ(r.busy[0], 6);
  EXPECT_DOUBLE_EQ(r.busy[1], 6);
  EXPECT_DOUBLE_EQ(simulate(make_schedule(ScheduleKind::one_f_one_b, 2, 2)).makespan, 9);  // free messages

  // AFAB, p = 3, m = 1: the one micro-batch crosses boundary 0 and 1 twice
  // each: 9 + 2 (d0 + d1), d0 = 0.5 + 100/100, d1 = 0.5 + 300/100; the last
  // stage's entry (no boundary after it) is never charged.
  SimCosts three;
  three.link = {0.5, 100};
  three.boundary_bytes = {100, 300, 1e9};
  EXPECT_DOUBLE_EQ(simulate(make_schedule(ScheduleKind::afab, 3, 1), three).makespan, 9 + 2 * (1.5 + 3.5));
  three.link.bytes_per_s = 0;  // bandwidth 0 = the bytes cost nothing: latency only
  EXPECT_DOUBLE_EQ(simulate(make_schedule(ScheduleKind::afab, 3, 1), three).makespan, 9 + 4 * 0.5);
}

// ZB-V, p = 2, m = 1, every chunk F = I = W = 0.5: the turn (stage 1 -> 2 on
// rank 1) is in memory, so 4 of the 6 hand-overs are messages, all on the
// critical path: 4.5 + 4d (by hand, on the rows asserted first).
TEST(SimulatorMessages, SimulatorChargesNoMessageAtTheVsTurn) {
  const Schedule v = make_schedule(ScheduleKind::zb_v, 2, 1);
  auto row = [](const Schedule& s, int r) {
    std::string out;
    for (const Action& a : s.ranks[r]) out += (out.empty() ? "" : " ") + action_str(a);
    return out;
  };
  ASSERT_EQ(row(lower(v), 0),
            "LoadMicroBatch(0,0) 0F0 SendAct(0,0) RecvAct(3,0) 3F0 3I0 SendGrad(3,0) 3W0 RecvGrad(0,0) 0B0");
  ASSERT_EQ(row(lower(v), 1), "RecvAct(1,0) 1F0 2F0 SendAct(2,0) RecvGrad(2,0) 2I0 1I0 SendGrad(1,0) 2W0 1W0");
  SimCosts c;
  c.stage.assign(4, StageCost{0.5, 0.5, 0.5});
  c.link = {1.5, 0};
  //   rank 0: 0F0 [0, .5]; 3F0 [1.5 + 2d, 2 + 2d], 3I0 to 2.5 + 2d, 3W0 to 3 + 2d; 0B0 [3.5 + 4d, 4.5 + 4d]
  //   rank 1: 1F0 2F0 [.5 + d, 1.5 + d]; 2I0 1I0 [2.5 + 3d, 3.5 + 3d]; 2W0 1W0 to 4.5 + 3d
  const SimResult r = simulate(v, c);
  ASSERT_FALSE(r.deadlock);
  EXPECT_DOUBLE_EQ(r.makespan, 4.5 + 4 * 1.5);
  EXPECT_DOUBLE_EQ(simulate(v, {c.stage, {}, {}}).makespan, 4.5);
  // A measured whole backward is played as measured: stage 0's B at 0.6 ends the step 0.4 earlier.
  c.stage[0].whole = 0.6;
  EXPECT_DOUBLE_EQ(simulate(v, c).makespan, 4.1 + 4 * 1.5);
}

// The receiver's side: a rendezvous message is copied by the receiver inside
// MPI (Open MPI's single-copy get), so one that arrives while the receiver
// computes costs it the copy when it reaches the receive. AFAB, p = 2, m = 2,
// F = I = W = 1 per stage, latency 0.5 + copy 1000 B / (1000 B/s) = 1, by hand:
//   rank 0: F0 [0,1] F1 [1,2]
//   rank 1: waits from 0; A0 offered at 1.5, copied in the wait: F0 [2.5,3.5];
//           A1 offered at 2.5 while F0 runs: copied at the receive, [3.5,4.5]; F1 [4.5,5.5]
//           B0 [5.5,7.5], B1 [7.5,9.5]
//   rank 0: G0 offered at 8, copied in its wait: B0 [9,11]; G1 offered at 10
//           while B0 runs: copied [11,12], B1 [12,14]: step 14.
// Eager, the same message time: A1 there at 3.5, F1 [3.5,4.5], B0 B1 to 8.5;
// rank 0: B0 [8,10], B1 [10,12]: step 12.
TEST(SimulatorMessages, SimulatorChargesTheReceiverTheCopyOfARendezvousMessage) {
  SimCosts c;
  c.link = {0.5, 1000};
  c.boundary_bytes = {1000, 0};
  c.eager_bytes = 100;
  const Schedule s = make_schedule(ScheduleKind::afab, 2, 2);
  const SimResult r = simulate(s, c);
  ASSERT_FALSE(r.deadlock) << r.where;
  ASSERT_GE(r.started[1].size(), 2u);
  EXPECT_EQ(r.started[1][1].second, (Action{Op::forward, 1, 1}));
  EXPECT_DOUBLE_EQ(r.started[1][0].first, 2.5);
  EXPECT_DOUBLE_EQ(r.started[1][1].first, 4.5);
  c.eager_bytes = 4096;
  const SimResult e = simulate(s, c);
  EXPECT_DOUBLE_EQ(e.started[1][0].first, 2.5);
  EXPECT_DOUBLE_EQ(e.started[1][1].first, 3.5);
  EXPECT_DOUBLE_EQ(r.makespan, 14);
  EXPECT_DOUBLE_EQ(e.makespan, 12);
}

}  // namespace
}  // namespace ringtrain
