#pragma once
// Op (one submitted all-reduce) and TensorQueue (user threads -> engine thread).
//
// Rules: user threads only push(); the engine thread only drain()s and
// finish()es. A name is "in flight" from push() until finish(), and may be in
// flight once at a time (a second push throws, naming it). After close() the
// queue refuses submissions with the close reason.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "message.hpp"
#include "ringtrain/core/tensor.hpp"

namespace ringtrain::detail {

using Clock = std::chrono::steady_clock;

struct Op {
  const void* owner = nullptr;  // the Engine::Impl that issued it
  std::string name;
  Tensor input, output;         // output shares input's storage when in place
  engine::Signature sig;
  Clock::time_point submitted{}, picked_up{};
  // Engine thread only.
  bool sent_full = false;       // requested through a full negotiation; sets no cache bit
  // Completion: `error` is written before `done` is released.
  std::string error;
  std::atomic<bool> done{false};
  std::atomic<bool> observed{false};  // a wait() saw the result
};

}  // namespace ringtrain::detail

namespace ringtrain::engine {

using detail::Clock;
using detail::Op;
using OpPtr = std::shared_ptr<Op>;

class TensorQueue {
 public:
  // Throws an Error if the queue is closed or `op->name` is in flight.
  void push(OpPtr op);
  std::vector<OpPtr> drain();
  bool has_incoming() const;
  void finish(const std::string& name);
  // Refuses further pushes with `reason`; returns what was queued but not drained.
  std::vector<OpPtr> close(const std::string& reason);
  bool closed() const;

 private:
  mutable std::mutex mu_;
  std::vector<OpPtr> incoming_;
  std::unordered_set<std::string> in_flight_;
  bool closed_ = false;
  std::string reason_;
};

}  // namespace ringtrain::engine
