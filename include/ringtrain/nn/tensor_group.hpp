#pragma once
// The tensor-parallel group a model is built for (the process grid's tp
// communicator); size 1 builds the ordinary model.
#include <cstdint>
#include <memory>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/task_thread.hpp"

namespace ringtrain {

// Time spent in the group's collectives (tp_all_reduce), for benchmarks:
// shared by every copy of the group (the layers hold copies), added to by the
// collectives, reset by whoever reads it.
struct TpStats {
  double seconds = 0;
  std::int64_t calls = 0;
  double bytes = 0;  // payload per call (one rank's tensor), summed
  void reset() { *this = TpStats{}; }
};

struct TensorGroup {
  Communicator comm;  // unused when size == 1
  int size = 1, rank = 0;
  std::shared_ptr<TpStats> stats;  // optional; null = not counted
  // Sequence parallelism inside a transformer block: its column / row layers
  // take / give token shards (all-gather before, reduce-scatter after)
  // instead of replicated tokens. Set by the block builder, not the grid.
  bool sequence = false;
  // The group's one helper thread (shared by every copy of the group, started
  // at its first task, joined when the last copy goes): ColumnParallel's
  // backward runs its dx collective there while this thread computes the
  // weight gradient. Null when size == 1.
  std::shared_ptr<TaskThread> helper;
  static TensorGroup of(const Communicator& c, std::shared_ptr<TpStats> s = nullptr) {
    TensorGroup g;
    g.comm = c;
    g.size = c.size();
    g.rank = c.rank();
    g.stats = std::move(s);
    if (g.size > 1) g.helper = std::make_shared<TaskThread>();
    return g;
  }
};

}  // namespace ringtrain
