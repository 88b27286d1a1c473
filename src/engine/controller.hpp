#pragma once
// Controller: decides, once per cycle and identically on every rank, which
// submitted tensors are ready everywhere. Rank 0 is the coordinator.
//
// Negotiation protocol (one cycle; every rank runs it in lock-step on the
// engine's private communicator):
//  1. Each rank classifies its pending ops that have not yet been requested:
//     a name in the response cache with the same signature (dtype, shape, op,
//     device kind) sets its slot's bit; anything else is "uncached".
//  2. ONE all-reduce (bitwise AND) of the word vector
//        [status | bits(W words) | ~bits(W words)]
//     where status holds inverted flags ("I have no uncached request", "I do
//     not want shutdown", "I (the coordinator) do not need a full round", "I
//     have nothing pending": the engine's idle back-off), so
//     AND gives their OR; AND of bits = ready on all ranks; AND of ~bits =
//     ~(OR of bits) = ready on some rank. W = cache slots / 64, the same on all
//     ranks because the cache changes only in step 7.
//  3. If any rank wants shutdown: stop (every op still outstanding fails).
//  4. Cached names whose AND bit is set are ready, in slot order (cache hits).
//     The coordinator feeds "set on some ranks only" names to the stall
//     inspector. If no status flag asks for more, the cycle ends here: this is
//     the steady state (one small all-reduce per cycle, no gather).
//  5. Full round: each rank sends the coordinator (gather of sizes + gatherv)
//     its bit-vector and its uncached requests (each op is requested once;
//     it then sets no bit). The coordinator adds the requests to its table
//     (name -> per-rank signature, kept across cycles). A name is complete
//     when every rank either requested it or has its cache bit set; complete
//     names give, in arrival order, an OK response or an ERROR response naming
//     the tensor, the differing values and the ranks. The stall inspector adds
//     WARNING / SHUTDOWN responses.
//  6. The coordinator broadcasts the response list (size, then bytes).
//  7. Every rank applies it in order: OK puts the name in the cache (LRU
//     eviction, deterministic) and makes the op ready after the cache hits of
//     step 4; ERROR uncaches the name and fails the op; WARNING goes to the
//     hook; SHUTDOWN stops the engine after failing every outstanding op.
// The coordinator asks for a full round (step 2's third flag) while its table
// holds a request for a cached name (the other ranks wait on that name with a
// bit set and would never send a request themselves: this is how a changed
// shape on one rank still reaches the error of step 5) and when the stall
// inspector has a warning or shutdown due. All blocking waits on MPI requests
// poll with short sleeps, so oversubscribed ranks do not spin.
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "message.hpp"
#include "response_cache.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "stall_inspector.hpp"
#include "tensor_queue.hpp"

namespace ringtrain::engine {

struct CycleResult {
  std::vector<OpPtr> ready;                           // execute in this order (same on all ranks)
  std::vector<std::pair<OpPtr, std::string>> failed;  // ERROR responses for this rank's ops
  std::vector<std::string> warnings;
  bool shutdown = false;
  std::string shutdown_reason;
  bool shutdown_requested = false;  // by a rank's shutdown(), not by the stall inspector
  bool negotiated = false;  // this cycle ran a full round
  std::size_t cache_hits = 0, cache_misses = 0;
  double seconds = 0;       // spent in the control collectives
  Clock::time_point synced_at{};  // when the bit-vector all-reduce completed
  bool all_idle = false;          // no rank had anything pending (same on all ranks)
};

class Controller {
 public:
  // Control collectives time out after comm.timeout_s().
  Controller(const Communicator& comm, std::size_t cache_capacity, double stall_warn_s, double stall_shutdown_s);

  // One cycle over this rank's pending ops (name -> op); ops made ready or
  // failed are returned, the caller removes them from `pending`.
  CycleResult cycle(const std::unordered_map<std::string, OpPtr>& pending, bool want_shutdown);

  const ResponseCache& cache() const { return cache_; }

 private:
  struct TableEntry {
    std::string name;
    std::vector<bool> requested;  // per rank
    std::vector<Signature> sig;   // per rank, valid where requested
    int count = 0;
  };
  std::vector<Response> coordinate(const std::vector<RankMessage>& msgs, Clock::time_point now);
  std::vector<Response> full_round(const std::unordered_map<std::string, OpPtr>& pending,
                                   const std::vector<std::uint64_t>& my_bits);
  std::vector<std::string> partial_names(const std::vector<std::uint64_t>& and_bits,
                                         const std::vector<std::uint64_t>& or_bits) const;
  bool table_holds_cached_name() const;

  Communicator comm_;
  int rank_, size_;
  ResponseCache cache_;
  std::uint64_t tick_ = 0;
  double timeout_s_;
  // Coordinator state.
  StallInspector stall_;
  std::map<std::uint64_t, TableEntry> table_;  // by arrival sequence
  std::unordered_map<std::string, std::uint64_t> table_index_;
  std::uint64_t seq_ = 0;
};

}  // namespace ringtrain::engine
