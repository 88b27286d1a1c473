// The device collectives behind ringtrain::allreduce/broadcast/allgather(v)/reduce_scatter with
// opt.device = cuda:i. One DeviceCollectives (staging slots, workspace) per
// (device, MPI communicator): collectives on one communicator never overlap
// (MPI's rule), while the fusion engine's thread and the main thread may use
// different communicators at the same time without sharing buffers.
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "ringtrain/cuda/backend.hpp"
#include "ringtrain/cuda/collectives.hpp"
#include "ringtrain/cuda/registry.hpp"

namespace ringtrain::cuda {
namespace {

class PerComm {
 public:
  DeviceCollectives& get(int device, MPI_Comm comm) {
    std::lock_guard lk(mu_);
    auto& slot = map_[{device, comm}];
    if (!slot) slot = std::make_unique<DeviceCollectives>(backend_context(device));
    return *slot;
  }

 private:
  std::mutex mu_;
  std::map<std::pair<int, MPI_Comm>, std::unique_ptr<DeviceCollectives>> map_;
};

}  // namespace

DeviceCollectiveFns make_device_collective_fns() {
  auto set = std::make_shared<PerComm>();
  DeviceCollectiveFns f;
  f.allreduce = [set](const void* send, void* recv, std::size_t count, DType dt, ReduceOp op, const Communicator& comm,
                      const CollectiveOptions& opt) {
    set->get(opt.device.index, comm.handle("allreduce")).allreduce(send, recv, count, dt, op, comm, opt);
  };
  f.broadcast = [set](void* buf, std::size_t count, DType dt, int root, const Communicator& comm,
                      const CollectiveOptions& opt) {
    set->get(opt.device.index, comm.handle("broadcast")).broadcast(buf, count, dt, root, comm, opt);
  };
  f.allgatherv = [set](const void* send, void* recv, const std::vector<std::size_t>& counts, DType dt,
                        const Communicator& comm, const CollectiveOptions& opt) {
    set->get(opt.device.index, comm.handle("allgatherv")).allgatherv(send, recv, counts, dt, comm, opt);
  };
  f.reduce_scatter = [set](const void* send, void* recv, const std::vector<std::size_t>& counts, DType dt,
                           ReduceOp op, const Communicator& comm, const CollectiveOptions& opt) {
    set->get(opt.device.index, comm.handle("reduce_scatter")).reduce_scatter(send, recv, counts, dt, op, comm, opt);
  };
  return f;
}

}  // namespace ringtrain::cuda
