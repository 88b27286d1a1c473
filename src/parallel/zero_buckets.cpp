#include "zero_buckets.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/nn/language.hpp"
#include "ringtrain/parallel/parts.hpp"
#include "ringtrain/parallel/stage.hpp"

namespace ringtrain {

std::vector<ZeroBucket> zero_buckets(Stage& stage, std::int64_t bucket_bytes, std::vector<int>& bucket_of_layer,
                                     const char* what) {
  const ParamArena& a = stage.arena();
  std::vector<ZeroBucket> buckets;
  std::vector<std::size_t> top;  // per dtype of a.dtypes(): the low end so far
  for (DType dt : a.dtypes()) top.push_back(static_cast<std::size_t>(a.grads_flat(dt).numel()));
  auto dtype_index = [&](DType dt) {
    const auto ds = a.dtypes();
    return static_cast<std::size_t>(std::find(ds.begin(), ds.end(), dt) - ds.begin());
  };
  bucket_of_layer.assign(static_cast<std::size_t>(stage.num_layers()), -1);
  std::vector<std::size_t> low = top;
  std::size_t bytes = 0, covered = 0;
  ZeroBucket cur;
  auto close = [&](bool last) {
    if (cur.layers == 0) return;
    const auto ds = a.dtypes();
    for (std::size_t d = 0; d < ds.size(); ++d) {
      const std::size_t lo = last ? 0 : low[d];
      if (lo < top[d]) cur.ranges.push_back({ds[d], lo, top[d]});
      cur.bytes += (top[d] - lo) * dtype_size(ds[d]);
      top[d] = low[d] = lo;
    }
    buckets.push_back(cur);
    cur = ZeroBucket{};
    bytes = 0;
  };
  for (int l = stage.num_layers(); l-- > 0;) {
    const auto& ps = stage.layer(l).params();
    if (ps.empty()) continue;
    for (std::size_t p : ps) {
      const ParamInfo& info = a.info(p);
      const std::size_t d = dtype_index(info.dtype), end = info.offset + static_cast<std::size_t>(shape_numel(info.shape));
      // Offsets fall from the last layer to the first, so ranges of whole layers tile the buffer.
      RT_CHECK(end <= top[d], what, ": internal error: parameter '", info.name,
               "' lies after a later layer's in the gradient buffer");
      low[d] = std::min(low[d], info.offset);
      bytes += static_cast<std::size_t>(shape_numel(info.shape)) * dtype_size(info.dtype);
      ++covered;
    }
    bucket_of_layer[static_cast<std::size_t>(l)] = static_cast<int>(buckets.size());
    if (cur.layers == 0) cur.high = l;
    cur.low = l;
    ++cur.layers;
    if (bytes >= static_cast<std::size_t>(bucket_bytes)) close(false);
  }
  close(true);
  if (cur.layers == 0 && !buckets.empty()) {  // the lowest layers filled the last bucket: it reaches down to 0
    const auto ds = a.dtypes();
    for (std::size_t d = 0; d < ds.size(); ++d)
      if (top[d] > 0) {
        buckets.back().ranges.push_back({ds[d], 0, top[d]});
        buckets.back().bytes += top[d] * dtype_size(ds[d]);
      }
  }
  RT_CHECK(covered == a.size(), what, ": internal error: ", a.size() - covered,
           " parameter(s) of the stage belong to no layer, so no layer's readiness covers their gradients");
  return buckets;
}

std::vector<std::vector<int>> zero_buckets_used(Stage& stage, const std::vector<int>& bucket_of_layer) {
  const ParamArena& a = stage.arena();
  auto owner_bucket = [&](const std::string& param) {
    for (int l = 0; l < stage.num_layers(); ++l)
      for (std::size_t q : stage.layer(l).params())
        if (a.info(q).name == param) return bucket_of_layer[static_cast<std::size_t>(l)];
    return -1;
  };
  std::vector<std::vector<int>> uses(static_cast<std::size_t>(stage.num_layers()));
  for (int l = 0; l < stage.num_layers(); ++l) {
    std::vector<int>& u = uses[static_cast<std::size_t>(l)];
    if (bucket_of_layer[static_cast<std::size_t>(l)] >= 0) u.push_back(bucket_of_layer[static_cast<std::size_t>(l)]);
    std::function<void(Layer&)> ties = [&](Layer& x) {
      if (auto* h = dynamic_cast<LmHead*>(&x))
        if (const int b = owner_bucket(h->tie() + ".weight"); b >= 0) u.push_back(b);
      x.for_each_child(ties);
    };
    ties(stage.layer(l));
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
  }
  return uses;
}

BucketPages::BucketPages(Stage& stage, bool grads) {
  std::size_t bytes = 0;
  for (DType dt : stage.arena().dtypes()) {
    const Tensor& flat = grads ? stage.arena().grads_flat(dt) : stage.arena().params_flat(dt);
    ledgers_.emplace_back(dt, PageLedger(flat));
    bytes += flat.nbytes();
  }
  // Buffers of at most one chunk in all stay resident: giving back 2 MiB would
  // cost a 2 MiB fault each step and save less than a process's fixed cost
  // (cnn at 2 ranks: 0.92x plain data parallelism's throughput with it).
  active_ = bytes > chunk_bytes();
}

PageLedger& BucketPages::of(DType dt) {
  for (auto& [d, l] : ledgers_)
    if (d == dt) return l;
  RT_FAIL("no page ledger for dtype ", dtype_name(dt));
}

void BucketPages::hold(const ZeroBucket& k) {
  if (!active_) {
    // Nothing is given back here, but ZeRO-3's release of the whole buffer
    // (ShardedOptimizer::release_params) may have: on chunked memory a use
    // needs it mapped again (on the host this is nothing).
    for (const ZeroRange& r : k.ranges) of(r.dt).take_back_all();
    return;
  }
  for (const ZeroRange& r : k.ranges) of(r.dt).hold(r.lo, r.hi);
}

void BucketPages::drop(const ZeroBucket& k) {
  if (!active_) return;
  for (const ZeroRange& r : k.ranges) of(r.dt).drop(r.lo, r.hi);
}

std::size_t BucketPages::chunk_bytes() const {
  std::size_t c = 0;
  for (const auto& [d, l] : ledgers_) c = std::max(c, l.chunk_bytes());
  return c;
}

void wait_group_ready(const Communicator& group, std::size_t b, const char* what, const std::atomic<bool>* hurry) {
  if (group.size() == 1) return;
  WaitOn on(group, "ZeRO's bucket agreement");
  on.nap_after_s = 0;  // paced from the start: see zero_buckets.hpp
  on.max_nap_s = 500e-6;
  on.hurry = hurry;
  MPI_Request req;
  check_mpi(MPI_Ibarrier(on.comm, &req), what, "MPI_Ibarrier");
  const std::string w = cat(what, " (the other ranks reaching bucket ", b, ")");
  wait_bounded(&req, 1, on, w.c_str(), OnStall::throw_error);  // past the timeout: an Error naming who answers
}

ZeroSyncBase::ZeroSyncBase(const ProcessGrid& grid, Stage& stage, ShardedOptimizer& zero, const GridConfig& cfg,
                           const char* what)
    : group_(grid.zero()), stage_(stage), zero_(zero), what_(what),
      accumulates_(cfg.micro_batches * cfg.accumulation > 1 || !cfg.zero_release), release_(cfg.zero_release) {
  buckets_ = zero_buckets(stage, cfg.bucket_bytes, bucket_of_layer_, what);
  uses_ = zero_buckets_used(stage, bucket_of_layer_);
  if (release_) grad_pages_ = std::make_unique<BucketPages>(stage, true);
  bool chunked = false;
  for (DType dt : stage.arena().dtypes()) chunked = chunked || stage.arena().grads_flat(dt).chunked_memory();
  lazy_grads_ = grad_pages_ && chunked && stage.fused_backward();
}

void ZeroSyncBase::start_worker() {
  worker_ = std::thread([this] {
    std::unique_lock<std::mutex> lk(mu_);
    try {
      while (work(lk)) {
      }
    } catch (...) {
      if (!lk.owns_lock()) lk.lock();
      error_ = std::current_exception();
      cv_.notify_all();
    }
  });
}

void ZeroSyncBase::stop_worker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void ZeroSyncBase::hold_grad_pages() {
  if (!grad_pages_) return;
  std::lock_guard<std::mutex> lk(pages_mu_);
  grads_held_.assign(buckets_.size(), lazy_grads_ ? 0 : 1);
  if (!lazy_grads_)
    for (const ZeroBucket& k : buckets_) grad_pages_->hold(k);
}

void ZeroSyncBase::hold_layer_grads(int l) {
  if (!lazy_grads_) return;
  std::lock_guard<std::mutex> lk(pages_mu_);
  for (int b : uses_[static_cast<std::size_t>(l)])
    if (!grads_held_[static_cast<std::size_t>(b)]) {
      grad_pages_->hold(buckets_[static_cast<std::size_t>(b)]);
      grads_held_[static_cast<std::size_t>(b)] = 1;
    }
}

void ZeroSyncBase::drop_grad_pages(int b) {
  if (!grad_pages_) return;
  std::lock_guard<std::mutex> lk(pages_mu_);
  // Only a bucket this step held: a drop of another would free chunks it shares with a held one.
  if (!grads_held_[static_cast<std::size_t>(b)]) return;
  grads_held_[static_cast<std::size_t>(b)] = 0;
  grad_pages_->drop(buckets_[static_cast<std::size_t>(b)]);
}

std::size_t ZeroSyncBase::full_grad_bytes() const {
  std::size_t n = 0;
  for (DType dt : stage_.arena().dtypes()) n += stage_.arena().grads_flat(dt).nbytes();
  return n;
}

std::size_t ZeroSyncBase::two_largest() const {
  std::size_t a = 0, b = 0;
  for (const ZeroBucket& k : buckets_) {
    if (k.bytes > a) std::swap(a, b), a = k.bytes;
    else b = std::max(b, k.bytes);
  }
  return a + b;
}

}  // namespace ringtrain
