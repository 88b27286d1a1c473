#include "controller.hpp"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain::engine {
namespace {

constexpr std::uint64_t kNoUncached = 1, kNoShutdown = 2, kNoForce = 4, kNoPending = 8;

// The peers' engine threads cycle even while their users compute, so a control
// collective only stays open when a peer process is gone or hung: after
// `timeout_s` (> 0) that is a StallError naming it, which the engine turns into
// MPI_Abort. Naps at once (nap_after_s 0): a peer that is not yet in this cycle
// is usually a whole cycle away, and the engine must not take the compute
// thread's core meanwhile.
void wait_mpi(MPI_Request& req, const char* what, double timeout_s, const Communicator& comm) {
  const std::string w = cat("fusion engine: ", what);
  wait_bounded(&req, 1, WaitOn(comm.handle(what), timeout_s, comm.name(), 0), w.c_str(), OnStall::throw_error);
}

void mpi_ok(int rc, const char* what) {
  RT_CHECK(rc == MPI_SUCCESS, "fusion engine: ", what, " failed (MPI error code ", rc, ")");
}

bool bit(const std::vector<std::uint64_t>& v, int slot) {
  std::size_t w = static_cast<std::size_t>(slot) / 64;
  return w < v.size() && ((v[w] >> (slot % 64)) & 1u);
}

}  // namespace

Controller::Controller(const Communicator& comm, std::size_t cache_capacity, double stall_warn_s,
                       double stall_shutdown_s)
    : comm_(comm), rank_(comm.rank()), size_(comm.size()), cache_(cache_capacity),
      timeout_s_(comm.timeout_s()), stall_(stall_warn_s, stall_shutdown_s) {}

bool Controller::table_holds_cached_name() const {
  for (const auto& [seq, e] : table_)
    if (cache_.slot_of(e.name) >= 0) return true;
  return false;
}

std::vector<std::string> Controller::partial_names(const std::vector<std::uint64_t>& and_bits,
                                                   const std::vector<std::uint64_t>& or_bits) const {
  std::vector<std::string> out;
  for (std::size_t w = 0; w < and_bits.size(); ++w) {
    std::uint64_t p = or_bits[w] & ~and_bits[w];
    for (int b = 0; p; ++b, p >>= 1)
      if ((p & 1u) && cache_.occupied(static_cast<int>(w * 64 + b)))
        out.push_back(cache_.name_at(static_cast<int>(w * 64 + b)));
  }
  return out;
}

CycleResult Controller::cycle(const std::unordered_map<std::string, OpPtr>& pending, bool want_shutdown) {
  const auto t0 = Clock::now();
  CycleResult res;
  ++tick_;

  // Step 1: classify.
  const std::size_t W = cache_.words();
  std::vector<std::uint64_t> mine(W, 0);
  bool uncached = false;
  for (const auto& [name, op] : pending) {
    if (op->sent_full) continue;
    int s = cache_.lookup(name, op->sig);
    if (s >= 0) mine[s / 64] |= std::uint64_t{1} << (s % 64);
    else uncached = true;
  }
  const bool force = rank_ == 0 && (table_holds_cached_name() || stall_.due(t0));

  // Step 2: the one small all-reduce.
  std::vector<std::uint64_t> v(1 + 2 * W);
  v[0] = (uncached ? 0 : kNoUncached) | (want_shutdown ? 0 : kNoShutdown) | (force ? 0 : kNoForce) |
         (pending.empty() ? kNoPending : 0);
  for (std::size_t w = 0; w < W; ++w) {
    v[1 + w] = mine[w];
    v[1 + W + w] = ~mine[w];
  }
  MPI_Request req;
  mpi_ok(MPI_Iallreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_UINT64_T, MPI_BAND,
                        comm_.handle("engine bit-vector all-reduce"), &req),
         "MPI_Iallreduce of the readiness bits");
  wait_mpi(req, "MPI_Iallreduce of the readiness bits", timeout_s_, comm_);
  res.synced_at = Clock::now();  // (almost) the same moment on every rank

  // Step 3: shutdown wins.
  if (!(v[0] & kNoShutdown)) {
    res.shutdown = res.shutdown_requested = true;
    res.shutdown_reason = "the engine was shut down (Engine::shutdown() or ~Engine() ran on some rank)";
    res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return res;
  }

  // Step 4: cache hits in slot order.
  std::vector<std::uint64_t> and_bits(v.begin() + 1, v.begin() + 1 + W), or_bits(W);
  for (std::size_t w = 0; w < W; ++w) or_bits[w] = ~v[1 + W + w];
  for (std::size_t w = 0; w < W; ++w)
    for (int b = 0; b < 64; ++b)
      if ((and_bits[w] >> b) & 1u) {
        int slot = static_cast<int>(w * 64 + b);
        RT_ASSERT(cache_.occupied(slot));
        auto it = pending.find(cache_.name_at(slot));
        RT_CHECK(it != pending.end(), "fusion engine: cached tensor '", cache_.name_at(slot),
                 "' is ready on all ranks but not pending on rank ", rank_, " (internal error)");
        res.ready.push_back(it->second);
        cache_.touch(slot, tick_);
        ++res.cache_hits;
      }
  if (rank_ == 0 && stall_.enabled()) {
    auto names = partial_names(and_bits, or_bits);
    for (const auto& [seq, e] : table_) names.push_back(e.name);
    stall_.update(names, t0);
  }

  res.all_idle = (v[0] & kNoPending) != 0;
  if ((v[0] & kNoUncached) && (v[0] & kNoForce)) {
    res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return res;  // steady state
  }

  // Steps 5-7.
  res.negotiated = true;
  std::vector<Response> responses = full_round(pending, mine);
  for (auto& r : responses) {
    switch (r.type) {
      case ResponseType::ok: {
        cache_.put(r.name, r.sig, tick_);
        auto it = pending.find(r.name);
        RT_CHECK(it != pending.end(), "fusion engine: tensor '", r.name,
                 "' was negotiated but is not pending on rank ", rank_, " (internal error)");
        res.ready.push_back(it->second);
        ++res.cache_misses;
        break;
      }
      case ResponseType::error: {
        cache_.erase(r.name);
        auto it = pending.find(r.name);
        if (it != pending.end()) res.failed.push_back({it->second, r.message});
        break;
      }
      case ResponseType::warning: res.warnings.push_back(r.message); break;
      case ResponseType::shutdown:
        res.shutdown = true;
        res.shutdown_reason = r.message;
        break;
    }
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return res;
}

std::vector<Response> Controller::full_round(const std::unordered_map<std::string, OpPtr>& pending,
                                             const std::vector<std::uint64_t>& my_bits) {
  MPI_Comm comm = comm_.handle("engine negotiation");
  RankMessage m;
  m.cache_bits = my_bits;
  for (const auto& [name, op] : pending) {
    if (op->sent_full || cache_.lookup(name, op->sig) >= 0) continue;
    m.requests.push_back({name, op->sig});
    op->sent_full = true;
  }
  // Deterministic arrival order within one rank: submission time, then name.
  std::sort(m.requests.begin(), m.requests.end(), [&](const Request& a, const Request& b) {
    auto ta = pending.at(a.name)->submitted, tb = pending.at(b.name)->submitted;
    return ta != tb ? ta < tb : a.name < b.name;
  });
  std::vector<std::uint8_t> bytes = encode(m);
  int n = static_cast<int>(bytes.size());

  std::vector<int> sizes(rank_ == 0 ? size_ : 0), displs;
  MPI_Request req;
  mpi_ok(MPI_Igather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm, &req), "MPI_Igather of request sizes");
  wait_mpi(req, "MPI_Igather of request sizes", timeout_s_, comm_);
  std::vector<std::uint8_t> all;
  if (rank_ == 0) {
    displs.resize(size_);
    long long total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[r] = static_cast<int>(total);
      total += sizes[r];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  mpi_ok(MPI_Igatherv(bytes.data(), n, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, 0, comm,
                      &req),
         "MPI_Igatherv of requests");
  wait_mpi(req, "MPI_Igatherv of requests", timeout_s_, comm_);

  std::vector<std::uint8_t> out;
  if (rank_ == 0) {
    std::vector<RankMessage> msgs(size_);
    for (int r = 0; r < size_; ++r) msgs[r] = decode_rank_message(all.data() + displs[r], sizes[r]);
    out = encode(coordinate(msgs, Clock::now()));
  }
  std::uint64_t out_n = out.size();
  mpi_ok(MPI_Ibcast(&out_n, 1, MPI_UINT64_T, 0, comm, &req), "MPI_Ibcast of the response size");
  wait_mpi(req, "MPI_Ibcast of the response size", timeout_s_, comm_);
  out.resize(out_n);
  mpi_ok(MPI_Ibcast(out.data(), static_cast<int>(out_n), MPI_BYTE, 0, comm, &req), "MPI_Ibcast of responses");
  wait_mpi(req, "MPI_Ibcast of responses", timeout_s_, comm_);
  return decode_responses(out.data(), out.size());
}

std::vector<Response> Controller::coordinate(const std::vector<RankMessage>& msgs, Clock::time_point now) {
  for (int r = 0; r < size_; ++r)
    for (const auto& q : msgs[r].requests) {
      auto [it, fresh] = table_index_.try_emplace(q.name, seq_);
      TableEntry& e = table_[it->second];
      if (fresh) {
        ++seq_;
        e.name = q.name;
        e.requested.assign(size_, false);
        e.sig.resize(size_);
      }
      RT_CHECK(!e.requested[r], "fusion engine: rank ", r, " requested '", q.name, "' twice (internal error)");
      e.requested[r] = true;
      e.sig[r] = q.sig;
      ++e.count;
    }

  std::vector<Response> out;
  std::vector<StallInspector::Presence> partial;
  for (auto it = table_.begin(); it != table_.end();) {
    TableEntry& e = it->second;
    int slot = cache_.slot_of(e.name);
    std::vector<bool> present(size_);
    bool all = true;
    for (int r = 0; r < size_; ++r) {
      present[r] = e.requested[r] || (slot >= 0 && bit(msgs[r].cache_bits, slot));
      all = all && present[r];
    }
    if (!all) {
      partial.push_back({e.name, std::move(present)});
      ++it;
      continue;
    }
    std::vector<Signature> sigs(size_);
    for (int r = 0; r < size_; ++r) sigs[r] = e.requested[r] ? e.sig[r] : cache_.sig_at(slot);
    std::string err = mismatch_message(e.name, sigs);
    if (err.empty()) out.push_back({ResponseType::ok, e.name, sigs[0], {}});
    else out.push_back({ResponseType::error, e.name, {}, err});
    table_index_.erase(e.name);
    it = table_.erase(it);
  }

  if (stall_.enabled()) {
    // Cached names with their bit set on some ranks only.
    for (int s = 0; s < static_cast<int>(cache_.num_slots()); ++s) {
      if (!cache_.occupied(s) || table_index_.count(cache_.name_at(s))) continue;
      std::vector<bool> present(size_);
      int k = 0;
      for (int r = 0; r < size_; ++r) k += (present[r] = bit(msgs[r].cache_bits, s));
      if (k > 0 && k < size_) partial.push_back({cache_.name_at(s), std::move(present)});
    }
    auto verdict = stall_.check(partial, now);
    for (auto& w : verdict.warnings) out.push_back({ResponseType::warning, {}, {}, std::move(w)});
    if (!verdict.shutdown.empty()) out.push_back({ResponseType::shutdown, {}, {}, verdict.shutdown});
  }
  return out;
}

}  // namespace ringtrain::engine
