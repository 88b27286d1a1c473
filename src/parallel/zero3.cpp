// ZeRO-3: each rank keeps its slice of every parameter (the ShardedOptimizer's
// shard); a bucket of consecutive layers is all-gathered into the stage's
// arena just before its layers' forward, again before their backward (and a
// deferred weight backward), and its pages are released once the pass moves
// on. The bucket a pass ends in stays until the next pass moves on from it
// (FSDP keeps the last layers likewise): the forward ends in the bucket the
// backward starts in, which so needs no second gather; an update, load or
// release of the full arena (ShardedOptimizer::params_version) voids it, and
// finish() releases it. While a bucket computes, the next one of the pass is gathered by the
// worker thread, which also reduce-scatters each bucket's gradients once the
// step's last backward made them (as ZeRO-2, grad_sync.cpp). One thread runs
// both kinds of collective in the order the main thread asked for them: the
// same order on every rank of the group, since every rank runs the same
// schedule over the same layers.
// A tied LM head (nn/language.hpp) reads and writes its embedding's weight,
// in an earlier layer's bucket: its use gathers that bucket (so a layer uses
// a set of buckets). Its gradient lands in the full-size buffer before the
// embedding's backward, which runs later in the pass; the bucket is
// reduce-scattered only once all its layers are ready, the embedding last.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "ringtrain/optim/sharded_optimizer.hpp"
#include "ringtrain/parallel/grad_sync.hpp"
#include "ringtrain/parallel/parts.hpp"
#include "ringtrain/nn/language.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "zero_buckets.hpp"

namespace ringtrain {
namespace {

constexpr const char* kWhat = "parallel.zero = 3";

class Zero3Sync final : public ZeroSyncBase, public ParamAccess {
 public:
  Zero3Sync(const ProcessGrid& grid, Stage& stage, ShardedOptimizer& zero, const GridConfig& cfg)
      : ZeroSyncBase(grid, stage, zero, cfg, kWhat), param_pages_(stage, false) {
    state_.assign(buckets_.size(), State::released);
    zero_.shard_params();
    start_worker();
  }
  ~Zero3Sync() override { stop_worker(); }
  const char* kind() const override { return "zero3"; }

  ParamAccess* param_access() override { return this; }

  void begin_step() override {
    zero_.ensure_sharded();  // a broadcast, load or materialize since the last step: the slice takes it
    check_version();
    for (ZeroBucket& b : buckets_) b.pending = b.layers;
    hold_grad_pages();  // until reduced (the worker has no reduce queued now)
    std::lock_guard<std::mutex> lk(mu_);
    reduced_ = 0;
    held_grads_ = peak_grads_ = buckets_.empty() ? 0 : buckets_.front().bytes;
    peak_params_ = held_params_;
  }

  void layer_ready(int l) override {
    const int b = bucket_of_layer_[static_cast<std::size_t>(l)];
    if (b < 0 || --buckets_[static_cast<std::size_t>(b)].pending > 0) return;
    std::lock_guard<std::mutex> lk(mu_);
    if (static_cast<std::size_t>(b) + 1 < buckets_.size()) held_grads_ += buckets_[static_cast<std::size_t>(b) + 1].bytes;
    peak_grads_ = std::max(peak_grads_, held_grads_);
    queue_.push_back({Op::reduce, b});
    cv_.notify_all();
  }

  void finish() override {
    std::unique_lock<std::mutex> lk(mu_);
    wait_main(lk, [&] { return reduced_ == buckets_.size(); });
    lk.unlock();
    release_all();  // the update makes what was gathered stale
    zero_.average_grads();
    last_peak_grads_ = accumulates_ ? full_grad_bytes() : peak_grads_;
    last_peak_params_ = peak_params_;
  }

  std::size_t grad_bytes_in_flight() const override {
    if (accumulates_) return full_grad_bytes();
    return last_peak_grads_ ? last_peak_grads_ : two_largest();
  }
  std::size_t param_bytes_in_flight() const override { return last_peak_params_ ? last_peak_params_ : two_largest(); }

  // The pass moves to layer l: its buckets are gathered (waited for), those it
  // leaves released, and the buckets of the pass's next layer that needs
  // others prefetched.
  void use(int l, Pass pass) override {
    const std::vector<int>& want = uses_[static_cast<std::size_t>(l)];
    if (want.empty()) return;
    if (pass != Pass::forward) hold_layer_grads(l);  // chunked memory: its gradient chunks mapped now
    zero_.ensure_sharded();  // evaluation after a checkpoint's materialize
    check_version();
    if (want == current_) return;
    for (int b : current_)
      if (!holds(want, b)) release(b);
    for (int b : want) request(b);
    current_ = want;
    const int step = pass == Pass::forward ? 1 : -1;
    for (int k = l + step; k >= 0 && k < static_cast<int>(uses_.size()); k += step) {
      const std::vector<int>& next = uses_[static_cast<std::size_t>(k)];
      if (next.empty() || next == want) continue;
      for (int b : next) request(b);
      break;
    }
    for (int b : want) wait_resident(b);
  }

  // Whatever the pass gathered goes (a prefetch it did not reach included),
  // but the buckets it ends in.
  void end_pass() override {
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      if (state_[b] != State::released && !holds(current_, static_cast<int>(b))) release(static_cast<int>(b));
  }

 private:
  enum class State { released, requested, resident };
  enum class Op { gather, reduce };
  struct Job {
    Op op;
    int bucket;
  };

  static bool holds(const std::vector<int>& v, int b) { return std::find(v.begin(), v.end(), b) != v.end(); }

  void release_all() {
    current_.clear();
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      if (state_[b] != State::released) release(static_cast<int>(b));
  }

  // Gathers of another version of the parameters are gone or stale: forgotten
  // (their pages released again, as the full arena may have been rewritten).
  void check_version() {
    if (zero_.params_version() == version_) return;
    release_all();
    version_ = zero_.params_version();
  }

  void request(int b) {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_[static_cast<std::size_t>(b)] != State::released) return;
    state_[static_cast<std::size_t>(b)] = State::requested;
    param_pages_.hold(buckets_[static_cast<std::size_t>(b)]);
    queue_.push_back({Op::gather, b});
    cv_.notify_all();
  }

  void wait_resident(int b) {
    std::unique_lock<std::mutex> lk(mu_);
    wait_main(lk, [&] { return state_[static_cast<std::size_t>(b)] == State::resident; });
  }

  void release(int b) {
    wait_resident(b);  // a prefetch still in flight writes into these pages
    param_pages_.drop(buckets_[static_cast<std::size_t>(b)]);
    std::lock_guard<std::mutex> lk(mu_);
    state_[static_cast<std::size_t>(b)] = State::released;
    held_params_ -= buckets_[static_cast<std::size_t>(b)].bytes;
  }

  // The worker: the jobs in the order they were asked for.
  bool work(std::unique_lock<std::mutex>& lk) override {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return false;
    const Job job = queue_.front();
    queue_.pop_front();
    lk.unlock();
    const ZeroBucket& k = buckets_[static_cast<std::size_t>(job.bucket)];
    group_ready(static_cast<std::size_t>(job.bucket));
    for (const ZeroRange& r : k.ranges) {
      if (job.op == Op::gather) zero_.gather_range(r.dt, r.lo, r.hi);
      else zero_.reduce_scatter_range(r.dt, r.lo, r.hi);
    }
    if (job.op == Op::reduce) drop_grad_pages(job.bucket);
    lk.lock();
    if (job.op == Op::gather) {
      state_[static_cast<std::size_t>(job.bucket)] = State::resident;
      held_params_ += k.bytes;
      peak_params_ = std::max(peak_params_, held_params_);
    } else {
      held_grads_ -= std::min(held_grads_, k.bytes);
      ++reduced_;
    }
    cv_.notify_all();
    return true;
  }

  BucketPages param_pages_;             // requested and resident buckets hold theirs (main thread)
  std::vector<int> current_;            // the buckets the pass is in, or the last pass ended in (main thread)
  std::uint64_t version_ = 0;         // of the parameters gathered (ShardedOptimizer::params_version)
  std::deque<Job> queue_;
  std::vector<State> state_;  // per bucket: its parameters
  std::size_t reduced_ = 0;   // buckets reduce-scattered this step
  std::size_t held_params_ = 0, peak_params_ = 0, last_peak_params_ = 0;  // gathered parameter bytes resident
  std::size_t held_grads_ = 0, peak_grads_ = 0, last_peak_grads_ = 0;     // full-buffer gradient bytes
};

}  // namespace

std::unique_ptr<GradSync> make_zero3_sync(const ProcessGrid& grid, Stage& stage, ShardedOptimizer& zero,
                                          const GridConfig& cfg) {
  return std::make_unique<Zero3Sync>(grid, stage, zero, cfg);
}

}  // namespace ringtrain
