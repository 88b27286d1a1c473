#pragma once
// ResponseCache: names that were negotiated successfully, each on a fixed bit
// position ("slot") of the steady-state readiness bit-vector.
//
// Rules: every rank holds an identical cache because it is changed only while
// applying the coordinator's broadcast responses and the AND of the bits, in
// the same order on every rank (put/erase/touch are deterministic, eviction
// included). A name maps to one slot; a slot's signature is the one last
// agreed on. capacity 0 = disabled (lookup always misses).
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "message.hpp"

namespace ringtrain::engine {

class ResponseCache {
 public:
  explicit ResponseCache(std::size_t capacity) : capacity_(capacity) {}

  bool enabled() const { return capacity_ > 0; }
  // Slot of `name` if cached with exactly `sig`, else -1.
  int lookup(const std::string& name, const Signature& sig) const;
  int slot_of(const std::string& name) const;  // -1 if not cached
  const std::string& name_at(int slot) const { return slots_.at(slot).name; }
  const Signature& sig_at(int slot) const { return slots_.at(slot).sig; }
  bool occupied(int slot) const { return slot >= 0 && slot < (int)slots_.size() && slots_[slot].used; }

  std::size_t num_slots() const { return slots_.size(); }
  std::size_t words() const { return (slots_.size() + 63) / 64; }  // bit-vector length in uint64
  std::size_t size() const { return index_.size(); }

  // Inserts or updates `name`; when full, evicts the least recently used
  // entry (ties: lowest slot). `tick` is the caller's cycle counter.
  void put(const std::string& name, const Signature& sig, std::uint64_t tick);
  void erase(const std::string& name);
  void touch(int slot, std::uint64_t tick) { slots_.at(slot).last_used = tick; }

 private:
  struct Slot {
    std::string name;
    Signature sig;
    std::uint64_t last_used = 0;
    bool used = false;
  };
  std::size_t capacity_;
  std::vector<Slot> slots_;
  std::unordered_map<std::string, int> index_;
};

}  // namespace ringtrain::engine
