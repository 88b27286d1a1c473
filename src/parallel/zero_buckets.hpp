#pragma once
// What ZeRO-2 (grad_sync.cpp) and ZeRO-3 (zero3.cpp) share: the buckets of
// consecutive layers whose gradients (and, at ZeRO-3, parameters) move
// together, and the nap-wait for the group before each bucket's collective.
// Internal to the parallel library.
#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/dtype.hpp"
#include "ringtrain/core/page_ledger.hpp"

namespace ringtrain {

class Stage;

struct ZeroRange {
  DType dt;
  std::size_t lo, hi;  // elements of dt's flat parameter / gradient buffer
};
struct ZeroBucket {
  std::vector<ZeroRange> ranges;
  std::size_t bytes = 0;
  int layers = 0, pending = 0;
  int low = 0, high = 0;  // its lowest and highest local layer with parameters
};

// Layers from the last back until a bucket holds bucket_bytes; for each dtype
// a bucket covers [its layers' lowest offset, the previous bucket's low end),
// the first from the buffer's end and the last down to 0, so the ranges tile
// every buffer (padding included) and each slice element is moved once.
// bucket_of_layer: per local layer, its bucket (-1: a layer without parameters).
// `what` names the feature in errors ("parallel.zero = 2").
std::vector<ZeroBucket> zero_buckets(Stage& stage, std::int64_t bucket_bytes, std::vector<int>& bucket_of_layer,
                                     const char* what);

// The pages of one kind of the stage's full buffers (gradients, or ZeRO-3's
// gathered parameters) that buckets in use hold; the rest go back to the system.
class BucketPages {
 public:
  BucketPages(Stage& stage, bool grads);
  void hold(const ZeroBucket& k);
  void drop(const ZeroBucket& k);
  std::size_t chunk_bytes() const;

 private:
  PageLedger& of(DType dt);
  std::vector<std::pair<DType, PageLedger>> ledgers_;
  bool active_ = false;  // more than one chunk in all: worth giving back
};

// Waits, napping, until every rank of the group has reached bucket b's
// collective. Entered at once, the collective would wait for a slower peer in
// its own loop, which wakes every few microseconds and takes the core from
// this rank's backward (measured: 0.75x the engine's throughput at 2 ranks on
// 2 cores). Naps grow to 500 us, or stay at 20 us while `hurry` is set: the
// rank's main thread waits for this collective and computes nothing meanwhile.
// Answers liveness pings; past the group's timeout it fails naming the ranks
// that do not respond.
void wait_group_ready(const Communicator& group, std::size_t b, const char* what,
                      const std::atomic<bool>* hurry = nullptr);

class ShardedOptimizer;
class GradSync;
class ProcessGrid;
struct GridConfig;

// ZeRO-3's part (zero3.cpp): gathers each bucket's parameters before use and
// reduce-scatters its gradients, both on one worker thread.
std::unique_ptr<GradSync> make_zero3_sync(const ProcessGrid& grid, Stage& stage, ShardedOptimizer& zero,
                                          const GridConfig& cfg);

}  // namespace ringtrain
