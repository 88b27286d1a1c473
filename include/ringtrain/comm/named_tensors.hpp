#pragma once
// Lists of named tensors (checkpoint state) moved between ranks as one byte
// stream each: names, dtypes, shapes and bytes. Host copies are made of device
// tensors; received tensors are new host tensors. Large streams travel in
// chunks below MPI's int count limit.
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/tensor.hpp"

namespace ringtrain {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

std::vector<char> pack_named(const NamedTensors& ts);
NamedTensors unpack_named(const std::vector<char>& bytes);

// Point to point on `comm` (tag range 7100..7101): a matched pair of calls.
void send_named(const NamedTensors& ts, int to, const Communicator& comm);
NamedTensors recv_named(int from, const Communicator& comm);
// Collective: every rank ends with root's list (as new host tensors on the others).
void broadcast_named(NamedTensors& ts, int root, const Communicator& comm);

}  // namespace ringtrain
