#pragma once
// Engine: Horovod-style asynchronous all-reduce of named tensors, driven by one
// background thread over a private duplicate of the caller's communicator.
//
//   Engine eng(comm, opts);                                     // EngineOptions below
//   Handle h = eng.allreduce_async("fc1.weight.grad", grad);   // in place, avg
//   ...                                                         // overlap compute
//   eng.wait(h);                                                // grad now averaged
//
// Rules this API keeps:
//  - Construction is collective over `comm`: every rank makes an Engine with
//    the same fusion threshold, fp16 setting, cache capacity and collective
//    algorithm/tree threshold/segment (a mismatch is an Error on every rank).
//    Options are explicit: the engine reads no environment variable (the
//    trainer fills them from the comm.* configuration keys). Destroying it on one rank stops it on all (see shutdown()).
//  - Tensors are matched across ranks by NAME, not by submission order: ranks
//    may submit in any order; a tensor is reduced once every rank submitted it,
//    and ready tensors are reduced in the same order on every rank.
//    The same name with a different dtype, shape or op on different ranks fails
//    that tensor's wait() on every rank with an Error naming the tensor, the
//    values and the ranks. One name may be in flight once per rank at a time.
//  - The tensor's memory must stay alive and untouched until wait()/poll()
//    reports completion (the engine keeps the Tensor, i.e. its storage, alive).
//  - Results are bitwise identical on every rank.
//  - A failure is reported through the handle (wait() rethrows it); nothing
//    blocks forever: a tensor that some ranks never submit produces a stall
//    warning after `stall_warning_s` and, with `stall_shutdown_s` > 0, fails
//    every outstanding handle on every rank and stops the engine cleanly.
//  - shutdown() on any rank stops the engines of all ranks at the next cycle;
//    handles still outstanding then fail with an Error saying so. Call
//    synchronize() first to finish what was submitted.
//  - The stall shutdown is always clean (Errors, no abort): every rank's engine
//    thread keeps cycling while its user code computes or waits, so the
//    coordinator's decision reaches every rank. What cannot be handled that way
//    is a peer whose engine no longer runs (process dead or hung) or an internal
//    MPI/collective failure: peers would block in the engine's next collective,
//    so the engine logs the cause and calls MPI_Abort (a control collective
//    open for the communicator's timeout, Communicator::timeout_s, counts as such).
//
// Averaging: op=avg sums on the wire and multiplies the sum by 1/size once,
// after the all-reduce (every rank scales the same sum, so results stay
// identical). Integer tensors divide by size (truncating).
//
// fp16 compression (fp16_allreduce): float32/float64 tensors are converted to
// float16 when packed, all-reduced in float16 (our collectives accumulate each
// step in float32 and round the partial sums to float16), and converted back,
// with the 1/size scaling done in float32 during that conversion. Expect a
// relative error of about 2^-11 per addition step (~1e-3 for a handful of
// ranks) and float16's range (|x| <= 65504 for the sums, subnormals below
// 6e-5). Other dtypes are sent as they are.
//
// Every submission is reduced: gradient accumulation is the caller's (the
// trainer submits a gradient once, after its last micro-batch).
//
// Timeline (Chrome trace JSON, loads in Perfetto/chrome://tracing): when
// `timeline` is set, rank 0 writes that file; with timeline_all_ranks every
// rank writes "<stem>.<rank><ext>" (timeline.json -> timeline.1.json). pid is
// the rank, one row (tid) per tensor name; "X" events per tensor: QUEUE
// (submitted -> picked up by the engine thread), NEGOTIATE (-> ready on all
// ranks), MEMCPY_IN_FUSION_BUFFER, ALLREDUCE (args: tensors fused, bytes),
// MEMCPY_OUT_FUSION_BUFFER (includes the averaging; a tensor reduced alone in
// its own memory has no MEMCPY_IN). The file is a JSON array, closed on shutdown.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/tensor.hpp"
#include "ringtrain/engine/autotune.hpp"
#include "ringtrain/engine/fusion_ops.hpp"

namespace ringtrain {

struct EngineOptions {
  // Fuse ready tensors of one dtype and op into buffers of at most this many
  // bytes (on the wire); 0 = no fusion, one all-reduce per tensor.
  std::size_t fusion_threshold = std::size_t{64} << 20;  // bytes (comm.fusion_threshold)
  // Pause between negotiation cycles. While no rank has anything pending the
  // pause grows to at most 32x (all ranks alike); a submission or a blocking
  // wait() starts the next cycle at once.
  double cycle_time_ms = 1.0;                            // ms (comm.cycle_time_ms)
  // Names negotiated at most this many at a time in the response cache
  // (least recently used evicted); 0 disables the cache (every cycle gathers).
  std::size_t cache_capacity = 1024;  // comm.cache_capacity
  bool fp16_allreduce = false;        // comm.fp16_allreduce
  std::string timeline;               // path; empty = off (comm.timeline)
  bool timeline_all_ranks = false;    // comm.timeline_all_ranks
  double stall_warning_s = 60.0;      // 0 = no check (comm.stall_warning_s)
  double stall_shutdown_s = 0.0;      // 0 = never (comm.stall_shutdown_s)
  // Passed to every data all-reduce (algorithm, tree threshold, ...); `device`
  // is set per fusion buffer (comm.algorithm, comm.tree_threshold, comm.segment_bytes).
  CollectiveOptions collective{};
  // Called on every rank with each stall warning's text (also logged on rank 0).
  // Runs on the engine thread: keep it short.
  std::function<void(const std::string&)> on_stall_warning;
  // Byte movers for non-CPU tensors (the CUDA backend provides one). CPU
  // tensors always use cpu_fusion_ops().
  std::shared_ptr<FusionOps> device_ops;
  // comm.autotune: search fusion_threshold, cycle_time_ms and the algorithm
  // per size during the first steps (engine/autotune.hpp). The engine thread
  // changes those two fields of its options while it searches: read options()
  // once autotune_result().finished (then it reports the setting in use).
  AutotuneOptions autotune;
};

// Cumulative counters of one Engine (stats() returns a snapshot; all ranks
// count the same numbers except the timings and wait figures).
struct EngineStats {
  std::uint64_t cycles = 0;              // background cycles run
  std::uint64_t negotiations = 0;        // cycles with a full gather/broadcast round
  std::uint64_t cache_hits = 0;          // tensors agreed on through the bit-vector
  std::uint64_t cache_misses = 0;        // tensors agreed on through a full negotiation
  std::uint64_t tensors_reduced = 0;     // tensors completed by an all-reduce
  std::uint64_t allreduces = 0;          // data all-reduce calls
  std::uint64_t fused_allreduces = 0;    // ... of which carried more than one tensor
  std::uint64_t bytes_reduced = 0;       // payload bytes all-reduced (on the wire)
  std::uint64_t errors = 0;              // tensors failed (mismatch, stall, shutdown)
  std::uint64_t stall_warnings = 0;
  double negotiate_seconds = 0;          // in the control all-reduce / gather / broadcast
  double allreduce_seconds = 0;          // in data all-reduces
  double memcpy_seconds = 0;             // packing, scaling and unpacking
  std::uint64_t waits = 0;               // wait() calls (synchronize counts one)
  // Time callers spent blocked in wait()/synchronize(): the communication that
  // was NOT hidden behind computation.
  double wait_seconds = 0;
};

namespace detail {
struct Op;
}

// The result of allreduce_async: cheap to copy; every copy refers to the same
// operation; waiting on it again after completion returns (or rethrows) again.
class Handle {
 public:
  Handle() = default;
  bool valid() const { return op_ != nullptr; }
  const std::string& name() const;  // the tensor's name

 private:
  friend class Engine;
  explicit Handle(std::shared_ptr<detail::Op> op) : op_(std::move(op)) {}
  std::shared_ptr<detail::Op> op_;
};

class Engine {
 public:
  // Collective over `comm`. Duplicates it, so engine traffic never matches the
  // caller's collectives on `comm`, and starts the background thread.
  Engine(const Communicator& comm, EngineOptions opts = {});
  ~Engine();  // shutdown() + join
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Reduces `tensor` in place across ranks (op: sum, avg, min or max).
  Handle allreduce_async(std::string name, Tensor tensor, ReduceOp op = ReduceOp::avg);
  // Out of place: `output` (same dtype and element count as `input`) receives
  // the result; `input` is only read.
  Handle allreduce_async(std::string name, Tensor input, Tensor output, ReduceOp op = ReduceOp::avg);

  // Blocks until the operation completed; rethrows its Error. A wait that has
  // to block also starts the engine's next cycle at once, and while a caller
  // is blocked the engine pauses only 0.1 ms between cycles (this rank has
  // nothing more to batch: what it submitted before waiting is all queued).
  void wait(const Handle& h);
  // True once the operation completed (successfully or not); never blocks.
  bool poll(const Handle& h) const;
  // Waits until every operation submitted so far completed; throws an Error
  // listing the ones that failed and were not yet wait()ed on.
  void synchronize();
  // Stops the engine on every rank at the next cycle (see the rules above);
  // joins the thread. Idempotent; further submissions throw.
  void shutdown();
  bool running() const;

  EngineStats stats() const;
  void reset_stats();
  const EngineOptions& options() const;
  // comm.autotune's state (finished = false without autotune).
  AutotuneResult autotune_result() const;
  int rank() const;
  int size() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Start-up helpers (synchronous, collective over `comm`).
// Broadcasts every tensor from `root` in place (initial parameters, optimizer
// state). All ranks must pass the same number of tensors with the same shapes
// and dtypes; a mismatch is an Error on every rank naming the first bad tensor.
void broadcast_tensors(std::vector<Tensor>& tensors, int root, const Communicator& comm,
                       const CollectiveOptions& opt = {});
// Checks that every tensor is bitwise identical on all ranks (64-bit checksums,
// min/max all-reduce); throws an Error on every rank naming the first tensor
// that differs (by names[i] when given, else its index) and which ranks hold
// which checksum.
void verify_identical(const std::vector<Tensor>& tensors, const Communicator& comm,
                      const std::vector<std::string>& names = {});

}  // namespace ringtrain
