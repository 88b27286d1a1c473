#pragma once
// A timed play of a schedule (schedule.hpp): every pipeline rank runs its
// lowered list in order; a compute action takes its stage's cost, a send
// costs its sender nothing when posted (the executor sends without blocking)
// and arrives one message time later (SimCosts::message_s: a latency plus the
// boundary's bytes over a bandwidth); a receive waits for that arrival.
// The sender's side, as the executor (executor.cpp) and MPI behave: a message
// over SimCosts::eager_bytes goes by rendezvous: the receiver (whose receives
// are all posted at the step's start) takes it only while it is inside MPI,
// i.e. not computing, and only then does the send complete; the executor
// waits for a slot's sends before a forward reuses the slot, and for all of
// them at the step's end. The play moves the ranks in time order and models
// both waits with the executor's slots. It predicts the step
// time, each rank's busy time and bubble, and each rank's peak count of
// activations held (F done, W not), which is what validate() and
// --print-plan report, and what parallel.schedule = auto compares.
//
// Costs are per stage (model chunk) and micro-batch: measured in the job's
// first steps (the executor's timings), or estimated from the layers' FLOPs.
#include <string>
#include <vector>

#include "ringtrain/parallel/schedule.hpp"

namespace ringtrain {

struct StageCost {
  double f = 1, i = 1, w = 1;  // forward, input gradient, weight gradient
  double whole = 0;            // a whole backward where measured (cheaper than I + W apart), else 0
  double b() const { return whole > 0 ? whole : i + w; }
};

// One pipeline message, send to arrival: latency_s + bytes / bytes_per_s
// (bytes_per_s = 0: the bytes cost nothing). Measured by a ping-pong between
// neighbouring stages (ScheduleExecutor::measure_link) or given.
struct LinkCost {
  double latency_s = 0;
  double bytes_per_s = 0;
  double time(double bytes) const { return latency_s + (bytes_per_s > 0 ? bytes / bytes_per_s : 0); }
};

struct SimCosts {
  std::vector<StageCost> stage;  // per global stage; empty = unit costs (F = I = W = 1)
  LinkCost link;                 // default: messages free
  // Per global stage g: bytes of one micro-batch's activation g -> g + 1 (its
  // gradient back is the same size); empty = 0 bytes (latency only).
  std::vector<double> boundary_bytes;
  // Messages of at most this many bytes complete at the sender when posted
  // (copied into the receiver's queue); larger ones wait for the receiver.
  // Open MPI's shared-memory transport default (btl_vader_eager_limit).
  double eager_bytes = 4096;
  const StageCost& of(int g) const;
  // The message across the boundary between stages g and g + 1.
  double message_s(int g) const;
};

struct SimResult {
  bool deadlock = false;
  std::string where;  // deadlock: each stuck rank and the action it waits in
  double makespan = 0;
  std::vector<double> busy;  // per rank
  std::vector<int> peak;     // per rank: most (stage, micro-batch) activations held at once
  // Per rank: the start time of each compute action, in list order.
  std::vector<std::vector<std::pair<double, Action>>> started;
  double bubble(int rank) const { return makespan > 0 ? 1 - busy[static_cast<std::size_t>(rank)] / makespan : 0; }
  double mean_bubble() const;
};

// A built-in kind's table with the zero-bubble kinds (zb-h1, zb-v) built by
// their greedy over these costs (per stage F, I, W and the messages) instead
// of unit ones; the other kinds do not depend on costs.
Schedule make_schedule(ScheduleKind kind, int p, int m, int virtual_stages, const SimCosts& costs);

// Every I of the table made a whole B (its W dropped): the same order with
// unsplit backwards (what parallel.replan_steps runs to measure them).
Schedule fuse_all(const Schedule& compute);
// A local search over which backwards stay split: each I in turn becomes a
// whole B (its W dropped) where the simulator plays the table faster with
// these costs (StageCost::whole: a B where measured, cheaper than I + W run
// apart), repeated while a pass improves, at most `passes` passes.
Schedule fuse_where_faster(const Schedule& compute, const SimCosts& costs, int passes = 4);

// A zero-bubble table (zb-h1, zb-v) rebuilt over measured costs. The
// unit-cost greedy places W where unit times leave room; on real layers F,
// I and W differ (a forward often costs more than I + W), and a split
// backward costs more than a whole one (W reads its operands again). The
// candidates: the greedy's table over the costs and `unit` (the unit-cost
// table), each with fuse_where_faster, and the fastest of them with its
// order searched (improve_order). `table` is the fastest where the
// simulator plays it at least `gain` (a fraction) faster than `unit` with
// the same costs, else empty.
struct Replan {
  Schedule table;
  double unit_s = 0, replanned_s = 0;  // played with the costs
  bool better() const { return !table.ranks.empty(); }
};
Replan replan_zero_bubble(const Schedule& unit, ScheduleKind kind, const SimCosts& costs, double gain = 0.01);

// improve_order: how far a move goes, how many passes, and how many actions
// it plays in all (a count, not a time, so that every rank builds the same
// table; 2e7 is about 3 s here, p = 8 and m = 32 with two chunks per rank).
struct SearchLimits {
  int window = 8;
  int passes = 8;
  long budget = 20'000'000;
};
// A local search over the order of each rank's compute actions: one action
// moves to another place on its rank, at most `window` places away, keeping
// each stage's forwards and its backwards in micro-batch order, each backward
// after its forward and each W after its I, and no chunk holding more
// activations than the starting table's fullest chunk (the executor's slots).
// A move is kept where the simulator plays the table faster with `costs`;
// deadlocking orders are refused by the play. Passes repeat while one improves.
Schedule improve_order(const Schedule& compute, const SimCosts& costs, const SearchLimits& limits = {});

// Plays s (lowered first when it is a compute table).
SimResult simulate(const Schedule& s, const SimCosts& costs = {});
// The mean step over `steps`, each played with its own costs (every stage's
// costs measured in that step). Where the stages' times vary from step to step,
// this is longer than the play of the mean costs: a step lasts as long as its
// slowest path, and the slow stage differs between steps. 0 for no steps.
double mean_makespan(const Schedule& s, const std::vector<SimCosts>& steps);
// Each step's play (the list mean_makespan averages), in the order given.
std::vector<double> step_makespans(const Schedule& s, const std::vector<SimCosts>& steps);
// The most compute any rank of this layout and cut has in a step: its
// forwards and, for each backward, the cheaper of a whole one and I + W. No
// table of these chunks runs faster (nor, with these costs, any schedule that
// keeps the cut): how far a table is from it is what a better order could
// gain, the rest only a better cut.
double busiest_rank_s(const Schedule& s, const SimCosts& costs);

// The costs of `table`'s chunks when the layers are cut by `counts` (layer
// counts per chunk): each chunk's forward + backward (the sum of its layers'
// `layer_costs`) split F = I = W, its message the last layer's output bytes
// (`layer_out_bytes`, may be empty) over `link`.
SimCosts chunk_costs(const std::vector<int>& counts, const std::vector<double>& layer_costs,
                     const std::vector<double>& layer_out_bytes = {}, const LinkCost& link = {});

// parallel.partition = time or params where a rank holds several chunks
// (interleaved, zb-v): the cut of the layers into table.layout.stages()
// chunks whose play of `table` (chunk_costs, messages free: the cut balances
// compute) is fastest. The chunk-balanced
// cut (balance_by_cost) minimises the largest chunk, but a rank runs all of
// its chunks, so which chunks share a rank sets the step. Every cut is played
// where there are at most `every_cut` of them, else the search starts from the
// chunk-balanced cut and moves one boundary by one layer while the play
// improves. Ties keep the chunk-balanced cut. One chunk per rank: that cut.
std::vector<int> balance_by_play(const std::vector<double>& layer_costs, const Schedule& table,
                                 long every_cut = 20000);

// What parallel.schedule = auto and --print-plan compare: each schedule
// played on stages cut from the model's layers (or unit stages), with the
// messages and the sender's waits charged.
struct PlanInput {
  // Per top-level layer: one micro-batch's forward + backward seconds
  // (layer_time_costs), split F = I = W; empty: unit stages (F = I = W =
  // 1/chunks per chunk; give `link` in the same units).
  std::vector<double> layer_costs;
  std::vector<double> layer_out_bytes;  // per layer: one micro-batch's output (the message a cut after it sends)
  LinkCost link;                        // default: messages free
  double eager_bytes = 4096;            // SimCosts::eager_bytes
  int ranks = 2, micro_batches = 4, virtual_stages = 2;
  bool uniform_cut = true;  // stages of equal layer counts, else cut by the costs (partition = time)
  std::vector<ScheduleKind> kinds = {ScheduleKind::one_f_one_b, ScheduleKind::afab, ScheduleKind::zb_h1,
                                     ScheduleKind::interleaved, ScheduleKind::zb_v};
};

struct SchedulePrediction {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int chunks = 1;        // per rank
  double step = 0;       // predicted step (seconds, or units)
  double bubble = 0;     // mean over the ranks
  double peak = 0;       // most activations held by a rank, in whole-stage micro-batches
  double busiest = 0;    // the busiest rank's compute (busiest_rank_s): no table of this cut is faster
  bool fits = true;      // peak at most 1f1b's (kinds must list 1f1b first)
  std::string skipped;   // why it cannot run here (then nothing else is set)
};

// One entry per in.kinds, in order. Throws Error should a built-in table deadlock.
std::vector<SchedulePrediction> predict_schedules(const PlanInput& in);

// parallel.schedule = auto: of 1f1b, zb-h1, interleaved (v >= 2, m a
// multiple of p) and zb-v, the fastest predicted among those that fit (peak
// activations at most 1f1b's) and can run (no more chunks than layers); a tie
// keeps 1f1b. `why` gets one line per candidate.
ScheduleKind pick_schedule(const PlanInput& in, std::string* why = nullptr);

}  // namespace ringtrain
