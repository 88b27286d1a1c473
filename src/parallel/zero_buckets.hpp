#pragma once
// What ZeRO-2 (grad_sync.cpp) and ZeRO-3 (zero3.cpp) share: the buckets of
// consecutive layers whose gradients (and, at ZeRO-3, parameters) move
// together, their pages, the nap-wait for the group before each bucket's
// collective, and the worker thread that runs the collectives.
// Internal to the parallel library.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/dtype.hpp"
#include "ringtrain/core/page_ledger.hpp"
#include "ringtrain/parallel/grad_sync.hpp"

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

// Per local layer, the buckets its passes read or write, ascending: its own,
// and for a tied LM head (itself or inside it) the bucket of the layer of the
// stage that registered the tied weight (none on the stage: the head's own
// parameters hold what it reads, in its own bucket).
std::vector<std::vector<int>> zero_buckets_used(Stage& stage, const std::vector<int>& bucket_of_layer);

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
// 2 cores). Naps grow to 500 us, or stay at 10 us while `hurry` is set: the
// rank's main thread waits for this collective and computes nothing meanwhile.
// Answers liveness pings; past the group's timeout it fails naming the ranks
// that do not respond.
void wait_group_ready(const Communicator& group, std::size_t b, const char* what,
                      const std::atomic<bool>* hurry = nullptr);

class ShardedOptimizer;
class ProcessGrid;
struct GridConfig;

// The part of ZeRO-2's and ZeRO-3's synchronisation that is the same: the
// data-parallel group, the buckets, the gradient pages (parallel.zero_release),
// and one worker thread running the buckets' collectives while the main thread
// computes. An error on the worker ends it and is raised on the main thread at
// its next wait. A subclass starts the worker last in its constructor and stops
// it first in its destructor (work() uses the subclass's members).
class ZeroSyncBase : public GradSync {
 public:
  bool shards_grads() const override { return true; }

 protected:
  ZeroSyncBase(const ProcessGrid& grid, Stage& stage, ShardedOptimizer& zero, const GridConfig& cfg, const char* what);
  // One unit of the worker's work, entered with mu_ held: waits for a job,
  // returns false once stop_ is set; the job runs with lk released.
  virtual bool work(std::unique_lock<std::mutex>& lk) = 0;
  void start_worker();
  void stop_worker();
  // The main thread waits (the worker polls its group faster meanwhile) until
  // done() holds; a worker's error is raised here.
  template <typename Done>
  void wait_main(std::unique_lock<std::mutex>& lk, Done done) {
    hurry_ = true;
    cv_.wait(lk, [&] { return done() || error_; });
    hurry_ = false;
    if (error_) std::rethrow_exception(error_);
  }
  // Waits for the group at bucket b (wait_group_ready), on the worker.
  void group_ready(std::size_t b) const { wait_group_ready(group_, b, what_, &hurry_); }
  // begin_step: every bucket's gradients are to come. Host pages are held at
  // once (they cost memory only once written); chunked memory (a device's) only
  // as the backward reaches each bucket (hold_layer_grads), as it is mapped on
  // hold, unless a split backward's zero_grads writes the whole buffer first.
  void hold_grad_pages();
  void hold_layer_grads(int l);  // before layer l's backward (the ParamAccess hook)
  void drop_grad_pages(int b);   // bucket b reduced
  std::size_t full_grad_bytes() const;
  std::size_t two_largest() const;  // before a step: one bucket in use, one in flight

  Communicator group_;  // the data-parallel group (grid.zero(), the ShardedOptimizer's)
  Stage& stage_;
  ShardedOptimizer& zero_;
  const char* what_;        // "parallel.zero = 2" in errors
  const bool accumulates_;  // the full gradient buffer is resident through the step (several micro-batches, or no release)
  const bool release_;      // parallel.zero_release
  std::vector<ZeroBucket> buckets_;
  std::vector<int> bucket_of_layer_;  // -1: a layer without parameters
  std::vector<std::vector<int>> uses_;  // per layer: the buckets it reads and writes (zero_buckets_used)
  bool lazy_grads_ = false;             // gradient chunks held per bucket as the backward reaches it
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::exception_ptr error_;

 private:
  std::unique_ptr<BucketPages> grad_pages_;  // buckets not yet reduced hold theirs
  std::vector<char> grads_held_;             // per bucket, this step (under pages_mu_)
  std::mutex pages_mu_;                      // the main thread holds while the worker drops
  std::atomic<bool> hurry_{false};            // the main thread waits for the worker
  std::thread worker_;
};

// ZeRO-3's part (zero3.cpp): gathers each bucket's parameters before use and
// reduce-scatters its gradients, both on one worker thread.
std::unique_ptr<GradSync> make_zero3_sync(const ProcessGrid& grid, Stage& stage, ShardedOptimizer& zero,
                                          const GridConfig& cfg);

}  // namespace ringtrain
