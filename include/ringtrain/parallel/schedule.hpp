#pragma once
// Pipeline schedules as data: a pure function (kind, stages p, micro-batches m,
// stage s) -> the instruction list stage s executes for one optimizer step.
// One executor (parallel/executor.hpp) interprets every schedule.
//
// Rules every generated list keeps (tests/parallel/schedule_test.cpp checks
// them for p <= 8, m <= 32):
//  - each micro-batch is forwarded (F), input-backwarded (B) and
//    weight-backwarded (W) exactly once, F before B before W;
//  - F(mb) is preceded by LoadMicroBatch (first stage) or RecvAct (others) and
//    followed by SendAct (all but the last stage); B(mb) is preceded by
//    RecvGrad (all but the last) and followed by SendGrad (all but the first)
//    — in afab and 1f1b W sits between B and SendGrad (the unsplit backward);
//  - the executor posts every receive of the step at its start and sends
//    without blocking, so a list can only wait in RecvAct/RecvGrad; the lists
//    of the p stages then never deadlock (a receive's send comes earlier in a
//    global order that respects every stage's list);
//  - the list holds the micro-batches' work only: the step's gradient
//    synchronisation and update are the parts the trainer calls after it
//    (parts.hpp).
//
//  afab   GPipe: all F, then all B (each B directly followed by its W).
//  1f1b   PipeDream-Flush: min(p-s-1, m) warm-up F, then F/B pairs, then the
//         remaining B (each followed by its W): at most p-s micro-batches'
//         activations alive on stage s.
//  zb-h1  Zero Bubble H1 (Qi et al., arXiv 2401.10241): B and W split; B is
//         on the critical path (sent upstream at once), W deferred into what
//         would be bubble. Built by a greedy over a unit-time model
//         (T_F = T_B = T_W, free communication): at each free slot run a
//         ready F, else a ready B, else the oldest pending W; an F needs fewer
//         than p-s micro-batches between F and B (1F1B's pacing) and fewer
//         than p between F and W (1F1B's peak, the paper's memory bound p·M_B).
//         Unit-time makespan for m >= p: 3m + p - 1, the paper's (checked for
//         p <= 8, m <= 32), against 1F1B's 3(m + p - 1).
#include <cstdint>
#include <string>
#include <vector>

namespace ringtrain {

enum class ScheduleKind { afab, one_f_one_b, zb_h1 };
// "afab" | "1f1b" | "zb-h1"; throws Error naming parallel.schedule otherwise.
ScheduleKind parse_schedule(const std::string& s);
const char* schedule_name(ScheduleKind k);

enum class Op : std::uint8_t {
  load_micro_batch,  // first stage: the micro-batch's input
  forward,
  backward_input,    // B: input gradient (layers without the split also do W's work here)
  backward_weight,   // W: weight gradient
  send_act,
  recv_act,
  send_grad,
  recv_grad,
};
const char* op_name(Op op);

struct Instr {
  Op op;
  int mb = -1;  // micro-batch
  bool operator==(const Instr&) const = default;
};

// Throws Error naming the values when p < 1, m < 1 or stage out of range.
std::vector<Instr> make_schedule(ScheduleKind kind, int p, int m, int stage);
std::string schedule_str(const std::vector<Instr>& s);  // "F0 F1 B0 W0 ..." (compute ops only)

// Micro-batches whose activations a stage holds at once (F done, W not).
int peak_in_flight(const std::vector<Instr>& s);

// Analytic bubble fraction (idle / total per stage) for F, B, W times:
// AFAB and 1F1B (p-1)/(m+p-1) (any times, with B+W together);
// ZB-H1 (Qi et al. Table 2): (p-1)(T_F+T_B-T_W) / (m(T_F+T_B+T_W) + (p-1)(T_F+T_B-T_W)).
double analytic_bubble(ScheduleKind kind, int p, int m, double tf = 1, double tb = 1, double tw = 1);

}  // namespace ringtrain
