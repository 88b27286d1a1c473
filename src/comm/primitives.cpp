#include "ringtrain/comm/primitives.hpp"

#include <algorithm>
#include <atomic>

#include "ringtrain/core/error.hpp"

namespace ringtrain {

namespace {
std::atomic<std::uint64_t> g_bytes_sent{0};
}  // namespace

std::uint64_t primitives_bytes_sent() { return g_bytes_sent.load(std::memory_order_relaxed); }

Primitives::Primitives(Transport& t, Reducer& r, Workspace& ws, const Config& cfg)
    : t_(t), r_(r), cfg_(cfg), rank_(t.rank()), size_(t.size()), esize_(dtype_size(cfg.dtype)), ws_(ws) {
  RT_CHECK(cfg_.window >= 1 && cfg_.window <= kMaxAhead, "collective primitives: window must be in [1, ",
           kMaxAhead, "], got ", cfg_.window);
  seg_elems_ = std::max<std::size_t>(1, cfg_.segment_bytes / esize_);
  slot_bytes_ = (seg_elems_ * esize_ + 63) / 64 * 64;
  scratch_ = static_cast<char*>(ws.get(scratch_bytes(cfg_)));
}

Primitives::~Primitives() {
  // Destruction during an exception still leaves no send reading freed memory.
  for (auto& p : pending_) t_.wait(p.req);
}

std::size_t Primitives::scratch_bytes(const Config& cfg) {
  std::size_t es = dtype_size(cfg.dtype);
  std::size_t seg = std::max<std::size_t>(1, cfg.segment_bytes / es) * es;
  return static_cast<std::size_t>(cfg.window) * ((seg + 63) / 64 * 64);
}

std::size_t Primitives::seg_len(std::size_t n, std::size_t k) const {
  std::size_t lo = k * seg_elems_;
  return std::min(seg_elems_, n - lo);
}

void Primitives::guard_write(const void* p, std::size_t bytes) {
  const char* lo = static_cast<const char*>(p);
  const char* hi = lo + bytes;
  auto it = std::remove_if(pending_.begin(), pending_.end(), [&](Pending& s) {
    if (s.hi <= lo || s.lo >= hi) return false;
    t_.wait(s.req);
    return true;
  });
  pending_.erase(it, pending_.end());
}

void Primitives::post_send(int to, const void* p, std::size_t bytes) {
  // Reap finished sends now and then so the list (and guard_write's scan) stays short.
  if (pending_.size() >= 64) {
    auto it = std::remove_if(pending_.begin(), pending_.end(), [&](Pending& s) { return t_.test(s.req); });
    pending_.erase(it, pending_.end());
  }
  const char* c = static_cast<const char*>(p);
  pending_.push_back({t_.isend(p, bytes, to), c, c + bytes});
  g_bytes_sent.fetch_add(bytes, std::memory_order_relaxed);
}

void Primitives::finish() {
  for (auto& p : pending_) t_.wait(p.req);
  pending_.clear();
}

void Primitives::send(int to, const void* src, std::size_t n) {
  const char* s = static_cast<const char*>(src);
  for (std::size_t k = 0, ns = num_segs(n); k < ns; ++k)
    post_send(to, s + k * seg_elems_ * esize_, seg_len(n, k) * esize_);
}

// Receives straight into the destination, kMaxAhead segments in flight; each
// landed segment is handed to `landed(k)` in order.
template <typename F>
void Primitives::recv_direct(int from, char* d, std::size_t n, F&& landed) {
  guard_write(d, n * esize_);
  std::size_t ns = num_segs(n), ahead = std::min<std::size_t>(kMaxAhead, ns);
  auto post = [&](std::size_t k) {
    recvs_[k % kMaxAhead] = t_.irecv(d + k * seg_elems_ * esize_, seg_len(n, k) * esize_, from);
  };
  for (std::size_t k = 0; k < ahead; ++k) post(k);
  for (std::size_t k = 0; k < ns; ++k) {
    t_.wait(recvs_[k % kMaxAhead]);
    if (k + ahead < ns) post(k + ahead);
    landed(k);
  }
}

void Primitives::recv(int from, void* dst, std::size_t n) {
  if (n == 0) return;
  recv_direct(from, static_cast<char*>(dst), n, [](std::size_t) {});
}

void Primitives::recv_copy_send(int from, int to, void* dst, std::size_t n) {
  if (n == 0) return;
  char* d = static_cast<char*>(dst);
  recv_direct(from, d, n, [&](std::size_t k) { post_send(to, d + k * seg_elems_ * esize_, seg_len(n, k) * esize_); });
}

// Posts the receives of the first `window` segments into the scratch slots;
// callers keep that many ahead. Returns the number posted.
std::size_t Primitives::post_recv_window(int from, std::size_t n) {
  std::size_t w = std::min<std::size_t>(cfg_.window, num_segs(n));
  for (std::size_t k = 0; k < w; ++k) {
    guard_write(in_slot(k), slot_bytes_);
    recvs_[k] = t_.irecv(in_slot(k), seg_len(n, k) * esize_, from);
  }
  return w;
}

void Primitives::reserve_blocks(std::size_t n) {
  RT_ASSERT(pending_.empty());  // no send may still read the blocks this replaces
  const std::size_t bytes = (n * esize_ + 63) / 64 * 64;
  if (bytes <= block_bytes_) return;
  blocks_ = static_cast<char*>(ws_.blocks(2 * bytes));
  block_bytes_ = bytes;
}

void Primitives::recv_reduce(int from, int to, const void* local, void* dst, std::size_t n, int divisor) {
  if (n == 0) return;
  const char* l = static_cast<const char*>(local);
  char* d = static_cast<char*>(dst);
  std::size_t ns = num_segs(n);
  std::size_t w = post_recv_window(from, n);
  for (std::size_t k = 0; k < ns; ++k) {
    std::size_t len = seg_len(n, k), off = k * seg_elems_ * esize_;
    t_.wait(recvs_[k % cfg_.window]);
    char* out = d + off;
    guard_write(out, len * esize_);
    r_.reduce(out, in_slot(k), l + off, len, cfg_.dtype, cfg_.op, divisor);
    // The slot is free again: the receive `window` segments ahead goes into it.
    if (k + w < ns) recvs_[k % cfg_.window] = t_.irecv(in_slot(k), seg_len(n, k + w) * esize_, from);
    if (to >= 0) {
      r_.flush();
      post_send(to, out, len * esize_);
    }
  }
  if (to < 0) r_.flush();
}

void Primitives::recv_reduce_copy(int from, const void* local, void* dst, std::size_t n, int divisor) {
  recv_reduce(from, -1, local, dst, n, divisor);
}

void Primitives::recv_reduce_copy_send(int from, int to, const void* local, void* dst, std::size_t n,
                                       int divisor) {
  recv_reduce(from, to, local, dst, n, divisor);
}

void Primitives::exchange_reduce(int peer, const void* local, void* dst, std::size_t n, int divisor) {
  if (n == 0) return;
  const char* l = static_cast<const char*>(local);
  char* d = static_cast<char*>(dst);
  std::size_t ns = num_segs(n);
  std::size_t w = post_recv_window(peer, n);
  send(peer, local, n);  // all of it, before dst (possibly == local) is overwritten
  bool local_left = rank_ < peer;
  for (std::size_t k = 0; k < ns; ++k) {
    std::size_t len = seg_len(n, k), off = k * seg_elems_ * esize_;
    t_.wait(recvs_[k % cfg_.window]);
    guard_write(d + off, len * esize_);
    const void* a = local_left ? static_cast<const void*>(l + off) : in_slot(k);
    const void* b = local_left ? static_cast<const void*>(in_slot(k)) : l + off;
    r_.reduce(d + off, a, b, len, cfg_.dtype, cfg_.op, divisor);
    if (k + w < ns) recvs_[k % cfg_.window] = t_.irecv(in_slot(k), seg_len(n, k + w) * esize_, peer);
  }
  r_.flush();
}

void Primitives::copy(void* dst, const void* src, std::size_t n) {
  if (n == 0 || dst == src) return;
  guard_write(dst, n * esize_);
  r_.copy(dst, src, n * esize_);
  r_.flush();
}

}  // namespace ringtrain
