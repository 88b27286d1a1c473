#pragma once
// ZeRO stages 1 and 2 (PyTorch's ZeroRedundancyOptimizer, Megatron's distributed
// optimizer): the optimizer state is sharded over the data-parallel group
// (stage 2 also the gradients: parallel/grad_sync.cpp reduce-scatters them in
// buckets during the backward, with reduce_scatter_range, and releases the full buffer).
// Per step: the gradients are reduce-scattered (averaged), each rank updates
// its slice of the parameters with slice-sized optimizer state, and the
// parameters are all-gathered. State memory per rank falls by the group size.
//
// Rules kept here:
// - Each flat parameter buffer of the arena (one per dtype) is cut into `dp`
//   contiguous slices of near-equal size; a boundary is 64-byte aligned and is
//   moved out of the padding between two parameters to the next one's start.
//   Rank r owns slice r. A parameter may straddle slices (even split of memory).
// - The slice is a ParamArena of its own (the shard): one entry per piece of a
//   parameter, laid out exactly like the slice of the full arena (same padding),
//   so the reduce-scatter writes into its gradients and the all-gather reads
//   from its parameters without copies. Any CPU Optimizer runs on it unchanged.
// - LARS and LAMB need whole-parameter norms: the pieces' partial sums of
//   squares are all-reduced over the group (Optimizer::set_sums_hook, one small
//   all-reduce per step). Clipping and the fp16 inf/NaN check work on shard()
//   and are combined by the caller (parallel/updater.cpp).
//   Results equal the unsharded optimizer up to summation order (not bitwise).
// - Every call is collective over the group, in the same order on every rank.
// - Checkpoints keep the per-parameter layout: gather() assembles the state on
//   the root into an ordinary Optimizer over the full arena (transiently, one
//   unsharded copy on the root); scatter() hands each rank its slice back.
// - ZeRO-3 (shard_params()): the slice's parameters are the only up-to-date
//   copy. The full arena is a gathering area: gather_range() all-gathers pieces
//   of it before use (parallel/zero3.cpp, whose PageLedger gives them back); the
//   step neither refreshes the slice from the full arena nor all-gathers.
//   materialize() makes the full arena whole again (checkpoints of the whole
//   model, train.verify_every); the next sharded use (ensure_sharded) takes the
//   slice from it again and releases it, so a broadcast or load of the full
//   arena in between is seen.
// - Host or device buffers: the collectives run where the full arena is. On a
//   device, ZeRO-2/3's full buffers are chunked memory (core/allocator.hpp)
//   whose chunks a PageLedger unmaps and maps again, as it gives host pages back.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/nn/parameters.hpp"
#include "ringtrain/optim/optimizer.hpp"

namespace ringtrain {

class ShardedOptimizer {
 public:
  using Factory = std::function<std::unique_ptr<Optimizer>(ParamArena&, const OptimizerConfig&)>;

  // Multiplies an arena's gradients by a factor in their compute type.
  using GradScale = std::function<void(ParamArena&, double)>;

  // `full`: the model's finalised arena (identical layout on every rank), on the
  // host or a device: the slice lives beside it and the step's collectives run
  // on its buffers (ZeRO-2/3 on a device: its buffers in chunked memory, Stage);
  // `group`: the data-parallel group; `make` builds the optimizer (default
  // make_optimizer); `scale`: the gradient averaging's multiplication (default
  // grad_utils' unscale_grads, host arenas only).
  ShardedOptimizer(ParamArena& full, const OptimizerConfig& cfg, Communicator group,
                   CollectiveOptions copt = {}, Factory make = {}, GradScale scale = {});
  ~ShardedOptimizer();

  // The full arena's gradients, averaged over the group, into this rank's slice
  // (ZeRO-1: once, after the backward).
  void reduce_scatter_grads();
  // ZeRO-2's pieces of it: elements [lo, hi) of dtype dt's full gradient buffer
  // summed over the group, each rank receiving the part inside its slice; once
  // ranges tiling every buffer are reduced, average_grads() divides by the group size.
  void reduce_scatter_range(DType dt, std::size_t lo, std::size_t hi);
  void average_grads();
  // Runs on elements [lo, hi) of dtype dt's full gradient buffer before they are
  // reduce-scattered (expert parallelism: the dense gradients are first averaged
  // over the expert group, the group here being the expert-data ranks; parallel/updater.cpp).
  using PreReduce = std::function<void(DType, std::size_t lo, std::size_t hi)>;
  void set_pre_reduce(PreReduce f) { pre_reduce_ = std::move(f); }
  // Updates this rank's slice from its averaged gradients, then all-gathers the
  // parameters into the full arena. The slice's parameters are first refreshed
  // from the full arena (so a broadcast or load of the full arena is seen).
  void step(double lr);
  std::int64_t steps() const { return inner_->steps(); }

  // ZeRO-3 (see the rules above). shard_params: from now on the slice owns the
  // parameters; the full arena is authoritative until the first ensure_sharded().
  void shard_params();
  bool params_sharded() const { return shard_params_; }
  // Elements [lo, hi) of dtype dt's full parameter buffer, each rank sending the
  // part inside its slice (our ring all-gather). Collective over the group.
  void gather_range(DType dt, std::size_t lo, std::size_t hi);
  // The full arena whole (collective; nothing to do if it already is).
  void materialize();
  // The slice takes its part of a whole full arena, whose pages are then
  // released (no communication; nothing to do when already sharded).
  void ensure_sharded();
  // A checkpoint was read into the slice's parameters: they own the values now.
  void mark_sharded();
  // Changes whenever what was gathered into the full arena may be stale or
  // gone (an update, a load, the full arena released): gathers made under
  // another version must not be used.
  std::uint64_t params_version() const { return params_version_; }

  // Bytes of optimizer state held by this rank (its slice's buffers + step).
  std::size_t state_bytes() const;
  // Collective: {max over ranks of state_bytes(), bytes one unsharded optimizer holds}.
  std::pair<std::size_t, std::size_t> state_bytes_summary() const;
  // Elements of dtype dt's flat buffer owned by each rank.
  const std::vector<std::size_t>& counts(DType dt) const;
  // This rank's slice as an arena: fp16 unscaling and clipping work on its
  // gradients (the trainer's update path combines the partial results).
  ParamArena& shard() { return shard_; }
  const ParamArena& shard() const { return shard_; }
  // Full-arena index of each shard parameter (a piece of that parameter).
  const std::vector<std::size_t>& full_index() const { return full_index_; }

  // Checkpoints. gather: the root gets an Optimizer over the full arena holding
  // the whole state (others get null). make_whole: an empty one on the root, to
  // restore a checkpoint into. scatter: every rank takes its slice of the root's
  // `whole` (ignored elsewhere), and the step counter.
  // This rank's slice of each optimizer state buffer, one entry per piece of a
  // parameter it touches (checkpoints written by every rank; no communication):
  // `slot` as in "optim/<slot>/<name>", `param` the full arena's index,
  // elements [begin, begin + data.numel()) of that parameter. Padding excluded.
  struct StateSlice {
    std::string slot;
    std::size_t param = 0;
    std::int64_t begin = 0;
    Tensor data;
  };
  std::vector<StateSlice> state_slices() const;
  // ZeRO-3: the same pieces of the slice's parameters (slot "param").
  std::vector<StateSlice> param_slices() const;
  // The step counter (int64 [1], a view): a checkpoint restores it with the slices.
  Tensor step_state() const;
  std::unique_ptr<Optimizer> gather(int root) const;
  std::unique_ptr<Optimizer> make_whole(int root) const;
  void scatter(const Optimizer* whole, int root);

 private:
  struct Slice {
    DType dtype;
    std::vector<std::size_t> counts, offsets;  // per rank, in elements of the full buffer
  };
  const Slice& slice(DType dt) const;
  void release_params(DType dt);  // gives the pages of dt's full parameter buffer back
  Tensor shard_flat(DType dt, bool grads) const;  // undefined when this rank's slice of dt is empty
  void combine_piece_sums(std::vector<double>& sums, int per) const;
  // MPI_Igatherv / MPI_Iscatterv of one state buffer (bounded), through host
  // copies where the buffers are on a device.
  void gatherv(const Tensor& src, const Tensor& dst, const Slice& s, std::size_t esz, int root) const;
  void scatterv(const Tensor& src, const Tensor& dst, const Slice& s, std::size_t esz, int root) const;
  void add_slices(const std::string& slot, DType dt, const Tensor& flat, std::vector<StateSlice>& out) const;

  ParamArena& full_;
  OptimizerConfig cfg_;
  Communicator group_;
  CollectiveOptions copt_;       // the step's collectives, on the arena's device
  CollectiveOptions host_copt_;  // the same on host scalars (norm pieces, byte counts)
  Factory make_;
  GradScale scale_;
  PreReduce pre_reduce_;
  std::vector<Slice> slices_;
  ParamArena shard_;
  std::vector<std::size_t> full_index_;  // shard parameter -> full parameter
  std::vector<std::string> state_names_;  // "<dtype>.<kind>" of the whole optimizer, in its order
  std::unique_ptr<Optimizer> inner_;
  bool shard_params_ = false;  // ZeRO-3
  bool whole_ = true;          // ZeRO-3: the full arena holds the parameters (else the slice does)
  std::uint64_t params_version_ = 0;
};

}  // namespace ringtrain
