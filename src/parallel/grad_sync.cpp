#include "ringtrain/parallel/grad_sync.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ringtrain/engine/engine.hpp"
#include "ringtrain/optim/sharded_optimizer.hpp"
#include "ringtrain/parallel/parts.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "zero_buckets.hpp"

namespace ringtrain {
namespace {

class NoSync final : public GradSync {
 public:
  const char* kind() const override { return "none"; }
};

// A bucket: consecutive layers whose gradients are one span of the arena,
// averaged over one group.
struct Bucket {
  Tensor grads;
  std::string name;
  int layers = 0, pending = 0;
  Engine* engine = nullptr;  // null: its group is this rank alone
};

// Whether any parameter of `a` is averaged over more than this rank.
bool reduces_anything(const ProcessGrid& grid, const ParamArena& a) {
  for (DimSet s : a.reduce_sets())
    if (grid.mesh().size(s) > 1) return true;
  return false;
}

class EngineSync final : public GradSync {
 public:
  // One engine per group the parameters are averaged over (the mesh's
  // group(reduce_over): data x context for dense weights): each duplicates its group.
  EngineSync(const ProcessGrid& grid, Stage& stage, const GridConfig& cfg, DeviceRuntime& rt) : stage_(stage) {
    EngineOptions eo = cfg.engine;
    if (cfg.deterministic) eo.fusion_threshold = 0;  // each bucket is its own all-reduce: composition never varies
    const ParamArena& a = stage.arena();
    for (DimSet s : a.reduce_sets())
      if (grid.mesh().size(s) > 1) {
        // Device byte movers of its own: each engine runs on its own thread, and the ops keep a copy
        // table (an expert-parallel stage's two engines sharing one raced on an H200).
        eo.device_ops = rt.fusion_ops(stage.device());
        engines_.push_back({s, std::make_unique<Engine>(grid.reduce_group(s), eo)});
      }
    engine_of_.resize(a.size());
    for (std::size_t p = 0; p < a.size(); ++p) engine_of_[p] = find(a.info(p).reduce_over);
    if (cfg.deterministic) make_buckets(cfg.bucket_bytes);
  }
  const char* kind() const override { return "engine"; }
  // The dense parameters' engine (statistics, autotuning), else the first.
  const Engine* engine() const override {
    Engine* e = find(kDenseReduce);
    return e ? e : engines_.empty() ? nullptr : engines_.front().engine.get();
  }

  void begin_step() override {
    for (Bucket& b : buckets_) b.pending = b.layers;
  }

  void layer_ready(int l) override {
    const int b = bucket_of_layer_.empty() ? -1 : bucket_of_layer_[static_cast<std::size_t>(l)];
    if (b >= 0) {  // comm.deterministic: the bucket goes once all its layers are ready
      Bucket& k = buckets_[static_cast<std::size_t>(b)];
      if (--k.pending == 0 && k.engine) handles_.push_back({k.engine, k.engine->allreduce_async(k.name, k.grads)});
      return;
    }
    for (std::size_t p : stage_.layer(l).params())
      if (Engine* e = engine_of_[p])
        handles_.push_back({e, e->allreduce_async(stage_.arena().info(p).name, stage_.arena().grad(p))});
  }

  void finish() override {
    for (auto& [e, h] : handles_) e->wait(h);
    handles_.clear();
  }

 private:
  // comm.deterministic: fusion by readiness changes which ring chunk (hence
  // which summation order) an element gets at DP >= 3, so the buckets are
  // fixed instead. A layer's parameters are a contiguous run of the arena:
  // when they share one dtype their gradients are one span (alignment padding
  // inside stays zero), and so are those of consecutive such layers. Buckets
  // gather layers from the last one back until they hold `bucket_bytes`.
  // A bucket's layers share one group: a layer whose parameters reduce over
  // several groups goes per parameter.
  void make_buckets(std::int64_t bucket_bytes) {
    const ParamArena& a = stage_.arena();
    bucket_of_layer_.assign(static_cast<std::size_t>(stage_.num_layers()), -1);
    std::size_t lo = 0, hi = 0, bytes = 0;
    DType dt = DType::f32;
    DimSet group;
    Bucket cur;
    auto close = [&] {
      if (cur.layers == 0) return;
      cur.grads = a.grads_flat(dt).flat_view(static_cast<std::int64_t>(lo), static_cast<std::int64_t>(hi - lo));
      cur.name = cat("bucket.", stage_.first_layer(), ".", buckets_.size());
      buckets_.push_back(cur);
      cur = Bucket{};
      bytes = 0;
    };
    for (int l = stage_.num_layers(); l-- > 0;) {
      const auto& ps = stage_.layer(l).params();
      if (ps.empty()) continue;
      const ParamInfo &first = a.info(ps.front()), &last = a.info(ps.back());
      bool one_span = true;
      for (std::size_t k = 0; k < ps.size(); ++k)
        one_span = one_span && a.info(ps[k]).dtype == first.dtype && a.info(ps[k]).reduce_over == first.reduce_over &&
                   (k == 0 || ps[k] == ps[k - 1] + 1);
      if (!one_span) {  // per parameter, still unfused
        close();
        continue;
      }
      const std::size_t end = last.offset + static_cast<std::size_t>(shape_numel(last.shape));
      if (cur.layers > 0 && (first.dtype != dt || end != lo || first.reduce_over != group))
        close();  // not adjacent, or another group: a new span
      if (cur.layers == 0) {
        hi = end;
        dt = first.dtype;
        group = first.reduce_over;
        cur.engine = find(group);
      }
      lo = first.offset;
      bytes += (end - first.offset) * dtype_size(first.dtype);
      bucket_of_layer_[static_cast<std::size_t>(l)] = static_cast<int>(buckets_.size());
      ++cur.layers;
      if (bytes >= static_cast<std::size_t>(bucket_bytes)) close();
    }
    close();
  }

  Engine* find(DimSet s) const {
    for (const auto& g : engines_)
      if (g.set == s) return g.engine.get();
    return nullptr;
  }

  struct Group {
    DimSet set;
    std::unique_ptr<Engine> engine;
  };
  Stage& stage_;
  std::vector<Group> engines_;
  std::vector<Engine*> engine_of_;  // per parameter; null: averaged over this rank alone
  std::vector<std::pair<Engine*, Handle>> handles_;  // in flight during one step (between the last backward and finish)
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_layer_;  // -1: per parameter
};

// ZeRO-1: one reduce-scatter of the whole gradient once the backward is over.
class ShardedSync final : public GradSync {
 public:
  explicit ShardedSync(ShardedOptimizer& zero) : zero_(zero) {}
  const char* kind() const override { return "sharded"; }
  void finish() override { zero_.reduce_scatter_grads(); }

 private:
  ShardedOptimizer& zero_;
};

// ZeRO-2: buckets of consecutive layers are reduce-scattered into the rank's
// slice by a worker thread as soon as the step's last backward made them (the
// backward of the layers below goes on meanwhile, as with the engine's
// all-reduce), and the bucket's pages of the full gradient buffer are then
// given back to the system (BucketPages: whole huge pages no unreduced bucket
// shares, which cost no memory until the next backward writes them). So with
// one micro-batch per step the full gradient is resident only for the buckets
// in flight; with more (the gradients accumulate over the step) all of it is,
// during the backward. parallel.zero_release = false keeps the pages resident.
// Buckets are reduced in a fixed order (the last layers' first), the same on
// every rank of the data-parallel group.
// On chunked memory (a device's) the stage calls use() before each layer's
// backward, and the bucket's gradient chunks are mapped then (ZeroSyncBase).
class Zero2Sync final : public ZeroSyncBase, public ParamAccess {
 public:
  Zero2Sync(const ProcessGrid& grid, Stage& stage, ShardedOptimizer& zero, const GridConfig& cfg)
      : ZeroSyncBase(grid, stage, zero, cfg, "parallel.zero = 2") {
    ready_.assign(buckets_.size(), 0);
    start_worker();
  }
  ~Zero2Sync() override { stop_worker(); }
  const char* kind() const override { return "zero2"; }
  ParamAccess* param_access() override { return lazy_grads_ ? this : nullptr; }
  void use(int l, Pass pass) override {
    if (pass != Pass::forward) hold_layer_grads(l);
  }
  void end_pass() override {}

  void begin_step() override {
    std::lock_guard<std::mutex> lk(mu_);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      buckets_[b].pending = buckets_[b].layers;
      ready_[b] = 0;
    }
    hold_grad_pages();  // until reduced (the worker is idle now)
    done_ = 0;
    held_ = peak_ = buckets_.empty() ? 0 : buckets_.front().bytes;  // the first bucket fills
  }

  void layer_ready(int l) override {
    const int b = bucket_of_layer_[static_cast<std::size_t>(l)];
    if (b < 0 || --buckets_[static_cast<std::size_t>(b)].pending > 0) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      ready_[static_cast<std::size_t>(b)] = 1;
      if (static_cast<std::size_t>(b) + 1 < buckets_.size()) held_ += buckets_[static_cast<std::size_t>(b) + 1].bytes;
      peak_ = std::max(peak_, held_);
    }
    cv_.notify_all();
  }

  void finish() override {
    std::unique_lock<std::mutex> lk(mu_);
    wait_main(lk, [&] { return done_ == buckets_.size(); });
    lk.unlock();
    zero_.average_grads();
    last_peak_ = accumulates_ ? full_grad_bytes() : peak_;
  }

  std::size_t grad_bytes_in_flight() const override {
    if (accumulates_ || last_peak_ == 0) return accumulates_ ? full_grad_bytes() : two_largest();
    return last_peak_;
  }

 private:
  // The worker: bucket 0, 1, ... of every step, each once all its layers are
  // ready. done_ == next: bucket 0 waits for the next step's begin_step (which resets done_).
  bool work(std::unique_lock<std::mutex>& lk) override {
    const std::size_t next = buckets_.empty() ? 0 : done_ % buckets_.size();
    cv_.wait(lk, [&] { return stop_ || (!buckets_.empty() && ready_[next] && done_ == next); });
    if (stop_) return false;
    lk.unlock();
    group_ready(next);
    for (const ZeroRange& r : buckets_[next].ranges) zero_.reduce_scatter_range(r.dt, r.lo, r.hi);
    drop_grad_pages(static_cast<int>(next));
    lk.lock();
    held_ -= std::min(held_, buckets_[next].bytes);
    done_ = next + 1;
    cv_.notify_all();
    return true;
  }

  std::vector<char> ready_;  // per bucket, this step
  std::size_t done_ = 0;     // buckets reduced this step
  std::size_t held_ = 0, peak_ = 0, last_peak_ = 0;  // full-buffer bytes between a bucket's filling and release
};

}  // namespace

std::unique_ptr<GradSync> make_grad_sync(const ProcessGrid& grid, Stage& stage, const GridConfig& cfg,
                                         DeviceRuntime& rt, ShardedOptimizer* zero) {
  // ZeRO-1 reduce-scatters even at one rank: that is how its slice gets its gradients.
  // ZeRO-3 gathers the parameters the layers use even in compute-only benchmarks.
  // With experts split, ZeRO's group is the expert-data ranks and the dense
  // gradients are first averaged over the expert group (parallel/updater.cpp).
  for (DimSet s : stage.arena().reduce_sets())
    RT_CHECK(!zero || s == kDenseReduce || (s == kExpertReduce && grid.ep_size() > 1), "parallel.zero = ",
             cfg.update.zero, ": ZeRO shards over the data-parallel group, but parameters of this model are averaged "
             "over ", s.str(), " (ZeRO needs every parameter replicated over ", kDenseReduce.str(), ")");
  if (zero && cfg.update.zero == 3) return make_zero3_sync(grid, stage, *zero, cfg);
  if (zero && !cfg.skip_allreduce && cfg.update.zero == 2) return std::make_unique<Zero2Sync>(grid, stage, *zero, cfg);
  if (zero && !cfg.skip_allreduce) return std::make_unique<ShardedSync>(*zero);
  if (!reduces_anything(grid, stage.arena()) || cfg.skip_allreduce) return std::make_unique<NoSync>();
  return std::make_unique<EngineSync>(grid, stage, cfg, rt);
}

}  // namespace ringtrain
