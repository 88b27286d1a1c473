#pragma once
// MicroBatchState: what one micro-batch's forward leaves for its backward in a
// tree of layers (the tensors a layer keeps, its outputs and gradient buffers,
// its kernels' saved statistics, indices and probabilities), held as one value
// outside the layers. A pipeline stage keeps ONE copy of its layers and one
// MicroBatchState per micro-batch in flight, and swaps the one it runs into the
// layers (Layer::swap_state); the parameters, weight copies, running
// statistics and the kernels' cached primitives stay with the layers, shared.
//
// Rules:
//  - A layer lists its members in Layer::visit_state by calling s(a, b, ...);
//    a kernel lists its forward-to-backward state the same way
//    (Kernel::visit_state). Each member is exchanged with the value stored for
//    it, found by the member's address and type: a state belongs to one set of
//    layer objects, and a kernel created later (on a first forward) or a
//    conditional member simply starts with a fresh value.
//  - A fresh value is default-constructed (an undefined tensor, an empty
//    vector): swapping a fresh state in gives the layers nothing to reuse, and
//    the next forward allocates; swapping it in and dropping what comes out
//    frees the buffers (Layer::release_activations).
//  - Listed members must be copyable and default-constructible.
#include <any>
#include <map>
#include <string>
#include <typeindex>
#include <utility>

namespace ringtrain {

class MicroBatchState {
 public:
  template <class... T>
  void operator()(T&... members) {
    (exchange(members), ...);
  }
  // A layer that does not list its state (Layer's default visit_state) says so
  // here: its buffers stay in the layer, shared by every micro-batch.
  void unlisted(const std::string& layer) {
    if (unlisted_.empty()) unlisted_ = layer;
  }
  const std::string& unlisted_layer() const { return unlisted_; }

 private:
  template <class T>
  void exchange(T& m) {
    std::any& a = items_[{static_cast<const void*>(&m), std::type_index(typeid(T))}];
    if (!a.has_value()) a = T{};
    using std::swap;
    swap(m, *std::any_cast<T>(&a));
  }

  std::map<std::pair<const void*, std::type_index>, std::any> items_;
  std::string unlisted_;
};

}  // namespace ringtrain
