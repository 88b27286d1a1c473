#pragma once
// The tensor-parallel group a model is built for (the process grid's tp
// communicator); size 1 builds the ordinary model.
#include "ringtrain/comm/communicator.hpp"

namespace ringtrain {

struct TensorGroup {
  Communicator comm;  // unused when size == 1
  int size = 1, rank = 0;
  static TensorGroup of(const Communicator& c) { return {c, c.size(), c.rank()}; }
};

}  // namespace ringtrain
