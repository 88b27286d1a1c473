#pragma once
// A timed play of a schedule (schedule.hpp): every pipeline rank runs its
// lowered list in order; a compute action takes its stage's cost, a send
// costs its sender nothing (the executor sends without blocking) and arrives
// one message time later (SimCosts::message_s: a latency plus the boundary's
// bytes over a bandwidth); a receive waits for that arrival. It predicts the step
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
  double f = 1, i = 1, w = 1;  // forward, input gradient, weight gradient; B = I + W
  double b() const { return i + w; }
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

// Plays s (lowered first when it is a compute table).
SimResult simulate(const Schedule& s, const SimCosts& costs = {});

}  // namespace ringtrain
