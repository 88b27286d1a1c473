#include "ringtrain/parallel/grad_sync.hpp"

#include <string>
#include <vector>

#include "ringtrain/engine/engine.hpp"
#include "ringtrain/optim/sharded_optimizer.hpp"
#include "ringtrain/parallel/parts.hpp"
#include "ringtrain/parallel/stage.hpp"

namespace ringtrain {
namespace {

class NoSync final : public GradSync {
 public:
  const char* kind() const override { return "none"; }
};

// A bucket: consecutive layers whose gradients are one span of the arena.
struct Bucket {
  Tensor grads;
  std::string name;
  int layers = 0, pending = 0;
};

class EngineSync final : public GradSync {
 public:
  EngineSync(const ProcessGrid& grid, Stage& stage, const GridConfig& cfg, DeviceRuntime& rt) : stage_(stage) {
    EngineOptions eo = cfg.engine;
    eo.device_ops = rt.fusion_ops(stage.device());
    if (cfg.deterministic) {
      eo.fusion_threshold = 0;  // each bucket is its own all-reduce: composition never varies
      make_buckets(cfg.bucket_bytes);
    }
    engine_ = std::make_unique<Engine>(grid.dp(), eo);
  }
  const char* kind() const override { return "engine"; }
  const Engine* engine() const override { return engine_.get(); }

  void begin_step() override {
    for (Bucket& b : buckets_) b.pending = b.layers;
  }

  void layer_ready(int l) override {
    const int b = bucket_of_layer_.empty() ? -1 : bucket_of_layer_[static_cast<std::size_t>(l)];
    if (b >= 0) {  // comm.deterministic: the bucket goes once all its layers are ready
      Bucket& k = buckets_[static_cast<std::size_t>(b)];
      if (--k.pending == 0) handles_.push_back(engine_->allreduce_async(k.name, k.grads));
      return;
    }
    for (std::size_t p : stage_.layer(l).params())
      handles_.push_back(engine_->allreduce_async(stage_.arena().info(p).name, stage_.arena().grad(p)));
  }

  void finish() override {
    for (auto& h : handles_) engine_->wait(h);
    handles_.clear();
  }

 private:
  // comm.deterministic: fusion by readiness changes which ring chunk (hence
  // which summation order) an element gets at DP >= 3, so the buckets are
  // fixed instead. A layer's parameters are a contiguous run of the arena:
  // when they share one dtype their gradients are one span (alignment padding
  // inside stays zero), and so are those of consecutive such layers. Buckets
  // gather layers from the last one back until they hold `bucket_bytes`.
  void make_buckets(std::int64_t bucket_bytes) {
    const ParamArena& a = stage_.arena();
    bucket_of_layer_.assign(static_cast<std::size_t>(stage_.num_layers()), -1);
    std::size_t lo = 0, hi = 0, bytes = 0;
    DType dt = DType::f32;
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
        one_span = one_span && a.info(ps[k]).dtype == first.dtype && (k == 0 || ps[k] == ps[k - 1] + 1);
      if (!one_span) {  // per parameter, still unfused
        close();
        continue;
      }
      const std::size_t end = last.offset + static_cast<std::size_t>(shape_numel(last.shape));
      if (cur.layers > 0 && (first.dtype != dt || end != lo)) close();  // not adjacent: a new span
      if (cur.layers == 0) {
        hi = end;
        dt = first.dtype;
      }
      lo = first.offset;
      bytes += (end - first.offset) * dtype_size(first.dtype);
      bucket_of_layer_[static_cast<std::size_t>(l)] = static_cast<int>(buckets_.size());
      ++cur.layers;
      if (bytes >= static_cast<std::size_t>(bucket_bytes)) close();
    }
    close();
  }

  Stage& stage_;
  std::unique_ptr<Engine> engine_;
  std::vector<Handle> handles_;  // in flight during one step (between the last backward and finish)
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_layer_;  // -1: per parameter
};

class ShardedSync final : public GradSync {
 public:
  explicit ShardedSync(ShardedOptimizer& zero) : zero_(zero) {}
  const char* kind() const override { return "sharded"; }
  void finish() override { zero_.reduce_scatter_grads(); }

 private:
  ShardedOptimizer& zero_;
};

}  // namespace

std::unique_ptr<GradSync> make_grad_sync(const ProcessGrid& grid, Stage& stage, const GridConfig& cfg,
                                         DeviceRuntime& rt, ShardedOptimizer* zero) {
  // ZeRO-1 reduce-scatters even at one rank: that is how its slice gets its gradients.
  if (zero && !cfg.skip_allreduce) return std::make_unique<ShardedSync>(*zero);
  if (grid.dp_size() == 1 || cfg.skip_allreduce) return std::make_unique<NoSync>();
  return std::make_unique<EngineSync>(grid, stage, cfg, rt);
}

}  // namespace ringtrain
