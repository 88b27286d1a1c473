#pragma once
// ringtrain's own collectives (Aluminum-style API). The algorithms are written
// once over point-to-point primitives (comm/primitives.hpp) and serve host
// buffers here and device buffers through the CUDA backend's transport.
//
// Semantics for every call: all ranks of `comm` call it with the same count,
// dtype and op; send == recv means in place; count 0 is a no-op that still
// validates arguments. Every rank ends with bitwise-identical results.
#include <cstddef>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/device.hpp"
#include "ringtrain/core/dtype.hpp"

namespace ringtrain {

enum class ReduceOp { sum, avg, min, max };
enum class Algorithm { automatic, ring, tree, mpi };

const char* op_name(ReduceOp op);
ReduceOp parse_op(const std::string& s);          // throws Error
const char* algorithm_name(Algorithm a);
Algorithm parse_algorithm(const std::string& s);  // "auto"/"automatic", "ring", "tree", "mpi"

struct CollectiveOptions {
  Algorithm algorithm = Algorithm::automatic;
  Device device = Device::cpu();  // where send/recv live
  // Messages of at most this many bytes use the tree under `automatic`;
  // < 0 means: RINGTRAIN_TREE_THRESHOLD from the environment, else the built-in default.
  long long tree_threshold = -1;
  // Check that count/dtype/op agree on all ranks (one small extra all-reduce).
  bool validate = false;
};

void allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
               const Communicator& comm, const CollectiveOptions& opt = {});
void broadcast(void* buf, std::size_t count, DType dtype, int root, const Communicator& comm,
               const CollectiveOptions& opt = {});
// recv holds size() * count elements, rank r's block at r * count.
void allgather(const void* send, std::size_t count, void* recv, DType dtype, const Communicator& comm,
               const CollectiveOptions& opt = {});
// recv holds sum(counts); rank r's block starts at sum(counts[0..r)).
void allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype,
                const Communicator& comm, const CollectiveOptions& opt = {});
// send holds sum(counts) elements; rank r receives the reduction of block r (counts[r] elements).
void reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype,
                    ReduceOp op, const Communicator& comm, const CollectiveOptions& opt = {});

// The algorithm `automatic` resolves to for this message.
Algorithm choose_algorithm(std::size_t bytes, int ranks, const CollectiveOptions& opt);

}  // namespace ringtrain
