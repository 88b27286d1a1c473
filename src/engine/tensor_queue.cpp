#include "tensor_queue.hpp"

#include "ringtrain/core/error.hpp"

namespace ringtrain::engine {

void TensorQueue::push(OpPtr op) {
  std::lock_guard lk(mu_);
  RT_CHECK(!closed_, "allreduce_async('", op->name, "'): the engine is shut down (", reason_, ")");
  RT_CHECK(in_flight_.insert(op->name).second, "allreduce_async('", op->name,
           "'): a tensor with this name is already in flight on this rank; wait() for it before "
           "submitting the name again");
  incoming_.push_back(std::move(op));
}

std::vector<OpPtr> TensorQueue::drain() {
  std::lock_guard lk(mu_);
  std::vector<OpPtr> out;
  out.swap(incoming_);
  return out;
}

bool TensorQueue::has_incoming() const {
  std::lock_guard lk(mu_);
  return !incoming_.empty();
}

void TensorQueue::finish(const std::string& name) {
  std::lock_guard lk(mu_);
  in_flight_.erase(name);
}

std::vector<OpPtr> TensorQueue::close(const std::string& reason) {
  std::lock_guard lk(mu_);
  if (!closed_) {
    closed_ = true;
    reason_ = reason;
  }
  std::vector<OpPtr> out;
  out.swap(incoming_);
  return out;
}

bool TensorQueue::closed() const {
  std::lock_guard lk(mu_);
  return closed_;
}

}  // namespace ringtrain::engine
