#pragma once
// GradSync: how a stage's gradients are synchronised over its data-parallel
// group, chosen once from the grid and the configuration:
//
//   none     one data-parallel rank (or a compute-only benchmark): nothing to do
//   engine   the fusion engine all-reduces (averages) each layer's gradients
//            as soon as the step's last backward made them, while the layers
//            below still compute; comm.deterministic: fixed buckets of
//            consecutive layers instead (bitwise-reproducible)
//   sharded  ZeRO-1: the gradients are reduce-scattered (averaged) into this
//            rank's slice once the backward is over; the Updater updates the
//            slice and all-gathers the parameters
//   zero2    ZeRO-2: as sharded, but buckets of layers are reduce-scattered
//            by a worker thread while the backward goes on (our ring, or shm
//            on one node), and each bucket's part of the full gradient buffer
//            is released afterwards: the rank keeps its gradient slice
//   zero3    ZeRO-3: as zero2, and the rank keeps only its slice of the
//            parameters too: it is also the stage's ParamAccess, gathering
//            each bucket's parameters before its layers use them and
//            releasing them after (zero3.cpp)
//
// The executor calls begin_step() before the step's first backward and
// layer_ready(l) once layer l's gradient of the step is complete; the trainer
// calls finish(), after which the gradients the Updater reads are final.
// Each kind owns its communicators (the engine duplicates grid.dp(); ZeRO uses
// grid.zero()). ZeRO-3's parameter gathering shares the reduce-scatters'
// worker thread (one order of collectives on every rank): the same object.
#include <cstddef>
#include <memory>

#include "ringtrain/parallel/device_runtime.hpp"
#include "ringtrain/parallel/grid.hpp"

namespace ringtrain {

class Engine;
class ParamAccess;
class ShardedOptimizer;
class Stage;
struct GridConfig;

class GradSync {
 public:
  virtual ~GradSync() = default;
  virtual const char* kind() const = 0;  // "none" | "engine" | "sharded" | "zero2" | "zero3"
  virtual void begin_step() {}
  virtual void layer_ready(int local_layer) {}
  virtual void finish() {}
  virtual const Engine* engine() const { return nullptr; }
  // ZeRO-2: the rank keeps only its slice of the gradients (the optimizer's
  // shard); the full buffer holds the buckets in flight, at most this many
  // bytes at once (measured over the last step; all of it when the gradients
  // accumulate over several micro-batches).
  virtual bool shards_grads() const { return false; }
  virtual std::size_t grad_bytes_in_flight() const { return 0; }
  // ZeRO-3: the stage's hook (Stage::set_param_access), and the most bytes of
  // gathered parameters resident at once over the last step.
  virtual ParamAccess* param_access() { return nullptr; }
  virtual std::size_t param_bytes_in_flight() const { return 0; }
};

// zero: the Updater's sharded optimizer when parallel.zero is 1, 2 or 3.
std::unique_ptr<GradSync> make_grad_sync(const ProcessGrid& grid, Stage& stage, const GridConfig& cfg,
                                         DeviceRuntime& rt, ShardedOptimizer* zero);

// A weight tied across pipeline stages (a language model's embedding on the
// first stage, its LM head's copy on the last; ParamInfo::copy_of): `inner`
// wrapped so that the layers holding it reach `inner` only at finish(), after
// their gradients were summed over grid.ends() (tied_grads.cpp). Both copies
// then take the same synchronised gradient and update, and stay bitwise
// equal. `inner` itself when the stage holds no tied weight (pipeline 1).
std::unique_ptr<GradSync> with_tied_grads(const ProcessGrid& grid, Stage& stage, std::unique_ptr<GradSync> inner);
// An Error naming the stage and parameter unless tied copies sit on the last
// stage and their owners on the first (no communication).
void check_tied_stages(const ProcessGrid& grid, Stage& stage);

}  // namespace ringtrain
