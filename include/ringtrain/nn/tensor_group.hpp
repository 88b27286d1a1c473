#pragma once
// The tensor-parallel group a model is built for (the process grid's tp
// communicator); size 1 builds the ordinary model.
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/task_thread.hpp"
#include "ringtrain/core/tensor.hpp"

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

// The buffers of the tensor- and sequence-parallel layers that live within
// one call, or until the next layer reads them. Each name says how long its
// contents are valid; every layer built from one group shares them, so
// activation memory holds each once, not once per layer. Owned by the group
// a model (a pipeline stage) is built with and freed with its layers: no
// process-global state, and two models in one process never share them.
enum class TpBuffer {
  gathered_input,  // a column layer's all-gathered tokens: from its forward to the end of that call, again in its backward
  gathered_grad,   // a row layer's all-gathered dz, an embedding's f32 partial sums: within one call
  dx_shard,        // a column layer's token shard of dx: until the previous layer's backward reads it
  sum_whole,       // tp_sum_f32's float32 sum: until the next tp_sum_f32
  sum_shard,       // tp_sum_f32's token shard of that sum: until the next tp_sum_f32
  row_partial,     // a row layer's whole-token partial products: until g's reduce-scatter in the same call
  column_dx,       // a column layer's whole-token dx: until its reduce-scatter in the same call
  pack_scratch,    // the rank-major packing of the sequence collectives: within one collective, under pack_mutex
  count
};
const char* workspace_name(TpBuffer w);

class TpWorkspaces {
 public:
  // A view of `w`'s buffer as `shape` x `dt` on `dev`, grown when too small
  // (earlier views of the same name become invalid then).
  Tensor get(TpBuffer w, const Shape& shape, DType dt, Device dev);
  // Bytes held by every buffer (benchmarks).
  std::size_t bytes() const;
  // The sequence collectives may run on the tensor group's helper thread while
  // the layer's own thread packs: pack_scratch is used under this lock.
  std::mutex& pack_mutex() { return pack_mutex_; }

 private:
  std::array<Tensor, static_cast<std::size_t>(TpBuffer::count)> slots_;
  std::mutex pack_mutex_;
};

struct TensorGroup {
  Communicator comm;  // unused when size == 1
  int size = 1, rank = 0;
  std::shared_ptr<TpStats> stats;  // optional; null = not counted
  // Shared by every copy of the group (each layer holds a copy).
  std::shared_ptr<TpWorkspaces> workspaces = std::make_shared<TpWorkspaces>();
  Tensor workspace(TpBuffer w, const Shape& shape, DType dt, Device dev) const {
    return workspaces->get(w, shape, dt, dev);
  }
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
