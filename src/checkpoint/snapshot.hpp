#pragma once
// checkpoint.async: the state a checkpoint writes, as a private host snapshot
// taken at the step boundary; a background thread (async_writer.hpp) then
// writes it while training continues. The copy is the whole stall:
//  - only views of the rank's live host memory are copied (a tensor gathered,
//    received or copied off the GPU is private already), so each byte once;
//  - one streamed copy per contiguous run of the arena's flat buffers
//    (non-temporal stores, split over the compute threads, idle then);
//  - into blocks reused from checkpoint to checkpoint (fresh pages cost more
//    than the copy), allocated and touched by prepare() at the run's start;
//  - the snapshot's tensors are views that keep their block alive, so a
//    trainer ending mid-write never frees memory under the write.
// Not thread-safe: one snapshot at a time (CheckpointSession::save waits for
// the previous write before asking for the next).
#include <functional>
#include <utility>
#include <vector>

#include "ringtrain/nn/parameters.hpp"
#include "ringtrain/train/state.hpp"

namespace ringtrain {

class Snapshot {
 public:
  // `live_state`: the rank's state as host and device tensors (its flat
  // buffers), listed once, at the first snapshot: what "live" means.
  explicit Snapshot(std::function<NamedTensorList()> live_state) : live_state_(std::move(live_state)) {}

  // A whole state (one file, on rank 0): its views of live host memory and
  // its device tensors become private copies; the others are kept.
  void take(NamedTensorList& state) { copy(state, true, true); }
  // A rank's pieces (checkpoint.parallel), each a view of live memory.
  void take(std::vector<StatePiece>& pieces);
  // The blocks the next take() of this state copies into, allocated and touched now.
  void prepare(NamedTensorList state) { copy(state, true, false); }
  void prepare(std::vector<StatePiece> pieces);

 private:
  void copy(NamedTensorList& state, bool check_live, bool copy);
  bool is_live(const Tensor& t);

  std::function<NamedTensorList()> live_state_;
  std::vector<std::pair<const char*, const char*>> live_ranges_;  // host memory of the state
  std::vector<Tensor> blocks_;  // the last snapshot's memory, reused by the next
};

}  // namespace ringtrain
