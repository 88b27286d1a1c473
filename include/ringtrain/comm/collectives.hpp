#pragma once
// ringtrain's own collectives (Aluminum-style API). The algorithms are written
// once over point-to-point primitives (comm/primitives.hpp) and serve host
// buffers here and device buffers through the CUDA backend's transport.
//
// Semantics for every call: all ranks of `comm` call it with the same count,
// dtype and op; send == recv means in place; count 0 is a no-op that still
// validates arguments. Every rank ends with bitwise-identical results.
// Argument errors throw ringtrain::Error naming the operation ("allreduce: ...").
// Local checks (null buffer with count > 0, closed communicator, partial overlap
// of send and recv, bad root/counts) are always on; with validate=true the ranks
// also agree on count/dtype/op/algorithm (one small MPI_Allreduce), and a bad
// argument on any rank raises an Error on every rank. Without validate a
// mismatch can stall the collective: the transport then aborts the job after
// the communicator's timeout (Communicator::timeout_s, default 300 s) with a message.
// avg = sum, then one division by the rank count (integers: truncating division);
// float16/bfloat16 accumulate in float32 and round once per combine step.
// Collectives on one communicator must not run concurrently (as in MPI).
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/comm/reduce_math.hpp"
#include "ringtrain/core/device.hpp"
#include "ringtrain/core/dtype.hpp"

namespace ringtrain {

// ReduceOp {sum, avg, min, max} is defined in reduce_math.hpp (shared with CUDA code).
// shm and hierarchical are all-reduce algorithms (comm/shm.hpp); the other
// collectives given one of them use the ring.
enum class Algorithm { automatic, ring, tree, mpi, shm, hierarchical };

const char* op_name(ReduceOp op);
ReduceOp parse_op(const std::string& s);          // throws Error
const char* algorithm_name(Algorithm a);
Algorithm parse_algorithm(const std::string& s);  // "auto"/"automatic", "ring", "tree", "mpi", "shm", "hierarchical"

struct CollectiveOptions {
  Algorithm algorithm = Algorithm::automatic;
  Device device = Device::cpu();  // where send/recv live
  // Messages of at most this many bytes use the tree under `automatic`;
  // < 0 means the built-in default (kDefaultTreeThreshold).
  long long tree_threshold = -1;
  // Check that count/dtype/op agree on all ranks (one small extra all-reduce).
  bool validate = false;
  // Pipelining segment of the ring/chain; 0 means the built-in default
  // (kDefaultSegmentBytes). Must agree on all ranks.
  std::size_t segment_bytes = 0;
  // shm/hierarchical: slot size and one-round limit in bytes (0 = the defaults
  // in comm/shm.hpp). They size the communicator's shared memory at its first
  // node-aware call; a later call asking for other sizes is an Error.
  std::size_t shm_chunk_bytes = 0, shm_small_bytes = 0;
};

// Defaults measured on the reference machine (see bench/comm_allreduce_sweep.cpp).
constexpr long long kDefaultTreeThreshold = 128 * 1024;
constexpr std::size_t kDefaultSegmentBytes = 512 * 1024;
// The threshold/segment in effect for `opt` (the option, else the default).
long long effective_tree_threshold(const CollectiveOptions& opt);
std::size_t effective_segment_bytes(const CollectiveOptions& opt);
// "4096", "64K", "1M", "2G" (powers of 1024) -> bytes; throws Error naming `what`.
std::size_t parse_byte_size(const std::string& s, const char* what = "size");

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

// The algorithm `automatic` resolves to for an all-reduce of this message on a
// communicator of `ranks` ranks over `nodes` nodes with at most `max_local` ranks
// on one node: shm on one node, hierarchical across nodes that hold several ranks,
// else tree up to the tree threshold and ring above.
Algorithm choose_algorithm(std::size_t bytes, int ranks, const CollectiveOptions& opt, int nodes = 1,
                           int max_local = 1);

// Collectives on device buffers (opt.device not the CPU) are forwarded to the
// functions the device's backend registered here (the CUDA backend does so from
// cuda/register.cu); they run this file's ring/tree algorithms over a device
// transport and reducer (allgather(v) and reduce_scatter always the ring).
struct DeviceCollectiveFns {
  std::function<void(const void*, void*, std::size_t, DType, ReduceOp, const Communicator&, const CollectiveOptions&)>
      allreduce;
  std::function<void(void*, std::size_t, DType, int, const Communicator&, const CollectiveOptions&)> broadcast;
  std::function<void(const void*, void*, const std::vector<std::size_t>&, DType, const Communicator&,
                     const CollectiveOptions&)>
      allgatherv;
  std::function<void(const void*, void*, const std::vector<std::size_t>&, DType, ReduceOp, const Communicator&,
                     const CollectiveOptions&)>
      reduce_scatter;
};
void register_device_collectives(DeviceKind kind, DeviceCollectiveFns fns);
// The registered functions, or an Error naming the device when none are.
const DeviceCollectiveFns& device_collectives(Device dev, const char* what);

}  // namespace ringtrain
