#pragma once
// Pipeline schedules as data. A schedule is a table: for every pipeline rank,
// the list of actions it runs for one optimizer step. Two levels, as
// torch.distributed.pipelining has them:
//  - compute: F (forward), B (full backward), I (input gradient), W (weight
//    gradient), each naming its model chunk by global stage index and its
//    micro-batch. make_schedule() generates these; a user may supply one
//    (read_schedule_csv, parallel.schedule = FILE.csv);
//  - lowered: lower() adds what the executor needs around them: the first
//    stage's LoadMicroBatch, and a RecvAct/SendAct (RecvGrad/SendGrad) pair
//    wherever consecutive stages sit on different ranks. Consecutive stages
//    on one rank (the V layout's turn) hand over in memory.
// validate() checks a table before anything runs (every rank alike); one
// executor (executor.hpp) interprets every table; simulate() (simulator.hpp)
// plays one with timed actions.
//
// Stages and ranks: the model is cut into S = p·v chunks (global stages
// 0..S-1, in model order). PipelineLayout says which rank holds which:
//   loop  stage g on rank g mod p (v = 1: one chunk per rank; v > 1:
//         Megatron's interleaved virtual stages);
//   v     zig-zag: chunk k of a rank is stage k·p + r for even k and
//         k·p + p-1-r for odd k (v = 2: rank 0 holds the first and the last
//         stage, ZB-V's layout).
// A rank's chunk k is stage stage_of(r, k); its chunks run in that order.
//
// Rules every valid table keeps (validate() names the first one broken):
//  - a rank lists only stages it holds; every stage forwards each of the m
//    micro-batches once and backwards it once, either with one B or with
//    one I and one W (I before W); F before its backward;
//  - in a rank's own order: F(g, i) after F(g-1, i) and the backward of
//    (g, i) after that of (g+1, i) when those stages are on the same rank;
//  - lowered, it cannot deadlock: the executor posts every receive of the
//    step at its start and sends without blocking, so a rank waits only in a
//    Recv; validate() plays the p lists against each other and fails naming
//    each rank's stuck action if some Recv can never be matched.
//
//  afab         GPipe: all F, then all B.
//  1f1b         PipeDream-Flush: min(p-r-1, m) warm-up F, then F/B pairs,
//               then the remaining B. At most p-r micro-batches in flight.
//  zb-h1        Zero Bubble H1 (Qi et al., arXiv 2401.10241): I and W split;
//               I on the critical path, W deferred into what would be bubble.
//               Built by a greedy over unit times (F = I = W, free
//               communication) with 1F1B's memory (at most p micro-batches
//               between F and W). Unit makespan 3m + p - 1 for m >= p.
//  interleaved  Megatron's interleaved 1F1B over v chunks per rank (loop
//               layout): forwards in rounds of p micro-batches per chunk,
//               (p-r-1)·2 + (v-1)·p warm-up forwards; m must be a multiple of p.
//  zb-v         ZB-V (Qi et al., arXiv 2405.15362): two chunks per rank in the
//               V layout, I/W split, built by the greedy with F = I = W per
//               chunk and the memory of 1F1B (2p chunk activations per rank).
#include <cstdint>
#include <string>
#include <vector>

#include "ringtrain/parallel/pipeline_layout.hpp"

namespace ringtrain {

enum class ScheduleKind { afab, one_f_one_b, zb_h1, interleaved, zb_v, file, automatic };
// "afab" | "gpipe" | "1f1b" | "zb-h1" | "interleaved" | "interleaved-1f1b" |
// "zb-v" | "auto", or a path ending in .csv (file); throws Error naming
// parallel.schedule otherwise. `auto` is resolved at start (pick_schedule).
ScheduleKind parse_schedule(const std::string& s);
const char* schedule_name(ScheduleKind k);

// The layout a kind runs on: loop with v chunks (interleaved: virtual_stages),
// v with 2 chunks (zb-v), loop with 1 chunk (the others).
PipelineLayout layout_for(ScheduleKind kind, int ranks, int virtual_stages);

enum class Op : std::uint8_t {
  forward,          // F
  backward,         // B: input and weight gradients together
  backward_input,   // I
  backward_weight,  // W
  load_micro_batch, // the first stage's input (lowered)
  send_act,
  recv_act,
  send_grad,
  recv_grad,
};
const char* op_name(Op op);
bool is_compute(Op op);

struct Action {
  Op op;
  int stage = 0;  // global stage (model chunk) index
  int mb = 0;     // micro-batch
  bool operator==(const Action&) const = default;
};
// "3F2" for compute actions (stage 3, forward, micro-batch 2; B, I, W alike),
// "RecvAct(3,2)" for the others.
std::string action_str(const Action& a);

struct Schedule {
  PipelineLayout layout;
  int micro_batches = 1;
  std::vector<std::vector<Action>> ranks;  // per pipeline rank, in order

  // Whether backwards are split into I and W (the stage then keeps weight gradients for later).
  bool split_backward() const;
};

// The compute table of a built-in kind. Throws Error naming the values when
// the kind cannot run them (p < 1, m < 1, interleaved with m not a multiple
// of p or v < 2, ...), the same on every rank.
Schedule make_schedule(ScheduleKind kind, int p, int m, int virtual_stages = 1);
// The table a job runs: a built-in kind's (virtual_stages: interleaved's
// chunks per rank), or the file's (kind = file). Its layout is the grid's
// (GridShape::chunks, placement).
Schedule step_schedule(ScheduleKind kind, const std::string& file, int p, int m, int virtual_stages);
// Its layout alone (the grid is made before the micro-batch count is known).
PipelineLayout schedule_layout(ScheduleKind kind, const std::string& file, int p, int virtual_stages);
// parallel.schedule = auto: pick_schedule (simulator.hpp).
// Adds loads, sends and receives (see above). Idempotent on lowered tables.
Schedule lower(const Schedule& compute);
// Throws Error naming the rank, the action and the rule (see above); accepts
// compute or lowered tables.
void validate(const Schedule& s);

// The rank x step table, one row per rank: "rank 0 | 0F0 0F1 ..." (compute
// actions only, "." where a rank idles in a unit-time play of the table).
std::string schedule_table(const Schedule& s);
// A user table: one line per pipeline rank, its compute actions separated by
// commas or spaces ("0F0,0F1,1F0,..."; empty cells and lines starting with #
// are ignored). The layout follows from where the stages are (loop or v), the
// micro-batch count from the highest one named. Validated; throws Error
// naming the file, line and cell.
Schedule read_schedule_csv(const std::string& path, int p);
// Comma-separated, readable by read_schedule_csv.
std::string schedule_csv(const Schedule& s);

// Per rank: the most (stage, micro-batch) activations held at once (F done,
// backward's weight half not), and the same per chunk of that rank.
std::vector<int> peak_in_flight(const Schedule& s);
std::vector<std::vector<int>> peak_in_flight_per_chunk(const Schedule& s);

// Analytic bubble fraction (idle / total per stage) for F, B, W times:
// AFAB and 1F1B (p-1)/(m+p-1) (any times, with B+W together);
// ZB-H1 (Qi et al. Table 2): (p-1)(T_F+T_B-T_W) / (m(T_F+T_B+T_W) + (p-1)(T_F+T_B-T_W));
// interleaved (p-1)/(v·m + p-1); ZB-V from the unit-time play.
double analytic_bubble(ScheduleKind kind, int p, int m, double tf = 1, double tb = 1, double tw = 1, int v = 1);

}  // namespace ringtrain
