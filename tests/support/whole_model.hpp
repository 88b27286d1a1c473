#pragma once
// A whole model for tests: a Stage over every top-level layer with one
// activation slot (parallel/stage.hpp), plus its backward in one call and the
// names of its layers.
#include <string>
#include <vector>

#include "ringtrain/parallel/stage.hpp"

namespace ringtrain::test_support {

// Both halves of the backward from the logits' gradient (no input gradient):
// the gradients accumulate into the arena (Stage::zero_grads starts a step).
inline void backward(Stage& m, const Tensor& dlogits) {
  m.backward_input(0, dlogits, false);
  m.backward_weight(0);
}

inline std::vector<std::string> layer_names(Stage& m) {
  std::vector<std::string> out;
  for (int i = 0; i < m.num_layers(); ++i) out.push_back(m.layer(i).name());
  return out;
}

}  // namespace ringtrain::test_support
