#include "response_cache.hpp"

namespace ringtrain::engine {

int ResponseCache::lookup(const std::string& name, const Signature& sig) const {
  int s = slot_of(name);
  return (s >= 0 && slots_[s].sig == sig) ? s : -1;
}

int ResponseCache::slot_of(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

void ResponseCache::put(const std::string& name, const Signature& sig, std::uint64_t tick) {
  if (!enabled()) return;
  if (int s = slot_of(name); s >= 0) {
    slots_[s].sig = sig;
    slots_[s].last_used = tick;
    return;
  }
  int slot = -1;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i)
    if (!slots_[i].used) {
      slot = i;
      break;
    }
  if (slot < 0 && slots_.size() < capacity_) {
    slots_.emplace_back();
    slot = static_cast<int>(slots_.size()) - 1;
  }
  if (slot < 0) {  // full: evict the least recently used
    slot = 0;
    for (int i = 1; i < static_cast<int>(slots_.size()); ++i)
      if (slots_[i].last_used < slots_[slot].last_used) slot = i;
    index_.erase(slots_[slot].name);
  }
  slots_[slot] = Slot{name, sig, tick, true};
  index_[name] = slot;
}

void ResponseCache::erase(const std::string& name) {
  int s = slot_of(name);
  if (s < 0) return;
  index_.erase(name);
  slots_[s] = Slot{};
}

}  // namespace ringtrain::engine
