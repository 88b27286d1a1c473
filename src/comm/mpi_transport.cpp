#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <thread>

#include <sched.h>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/comm/stall_diagnosis.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain {
namespace {

static_assert(sizeof(MPI_Request) <= sizeof(std::uint64_t), "MPI_Request must fit a Request handle");

std::uint64_t pack(MPI_Request r) {
  std::uint64_t h = 0;
  std::memcpy(&h, &r, sizeof r);
  return h;
}
MPI_Request unpack(std::uint64_t h) {
  MPI_Request r;
  std::memcpy(&r, &h, sizeof r);
  return r;
}

}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm, int tag, const char* what, const char* comm_name, double timeout_s,
                           double spin_s)
    : comm_(comm), tag_(tag), what_(what), comm_name_(comm_name), timeout_s_(timeout_s), spin_s_(spin_s),
      on_(comm, timeout_s, comm_name) {
  RT_CHECK(tag >= 0 && tag <= kMaxMpiTag, what, ": MPI tag ", tag, " is outside 0..", kMaxMpiTag,
           ", the range every MPI library accepts");
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Request MpiTransport::isend(const void* buf, std::size_t bytes, int peer) {
  RT_CHECK(bytes <= static_cast<std::size_t>(INT32_MAX), what_, ": message of ", bytes, " bytes exceeds MPI's int count");
  MPI_Request req;
  int rc = MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag_, comm_, &req);
  RT_CHECK(rc == MPI_SUCCESS, what_, ": MPI_Isend of ", bytes, " bytes to rank ", peer, " on '", comm_name_,
           "' failed (MPI error ", rc, ")");
  return Request{pack(req), peer, true, true};
}

Request MpiTransport::irecv(void* buf, std::size_t bytes, int peer) {
  RT_CHECK(bytes <= static_cast<std::size_t>(INT32_MAX), what_, ": message of ", bytes, " bytes exceeds MPI's int count");
  MPI_Request req;
  int rc = MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag_, comm_, &req);
  RT_CHECK(rc == MPI_SUCCESS, what_, ": MPI_Irecv of ", bytes, " bytes from rank ", peer, " on '", comm_name_,
           "' failed (MPI error ", rc, ")");
  return Request{pack(req), peer, false, true};
}

bool MpiTransport::test(Request& r) {
  if (!r.active) return true;
  MPI_Request req = unpack(r.handle);
  int flag = 0;
  int rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
  // A truncated receive (the ranks disagree on a message's size) fails here.
  RT_CHECK(rc == MPI_SUCCESS, what_, ": MPI_Test (", r.is_send ? "send to" : "receive from", " rank ", r.peer,
           " on '", comm_name_, "') failed (MPI error ", rc, "; do all ranks pass the same count and dtype?)");
  r.handle = pack(req);
  if (!flag) return false;
  r.active = false;
  return true;
}

// wait_bounded (comm/bounded_wait.hpp), with this transport's pacing: keep the
// core for spin_s_ (a peer that was preempted for a moment is back soon, and
// giving the core away would cost us a whole scheduler slice), then yield
// between polls. Once one wait has spun out, the rest of the call yields at once.
void MpiTransport::wait(Request& r) {
  if (!r.active) return;
  MPI_Request req = unpack(r.handle);
  on_.spin_s = yielding_ ? 0 : spin_s_;
  try {
    if (wait_bounded(&req, 1, on_, what_, OnStall::throw_error) > spin_s_) yielding_ = true;
  } catch (const StallError& e) {
    stalled(r, e);
  } catch (const Error& e) {
    // A truncated receive (the ranks disagree on a message's size) fails here.
    RT_FAIL(what_, ": waiting to ", r.is_send ? "send to" : "receive from", " rank ", r.peer, " on '", comm_name_,
            "' failed (", e.what(), "; do all ranks pass the same count and dtype?)");
  }
  r.handle = pack(req);
  r.active = false;
}

void MpiTransport::stalled(const Request& r, const StallError& e) const {
  // The peer we wait for may itself wait for another rank: e names who never came.
  if (rank_ == e.first_live)
    log::error(what_, ": stalled for ", static_cast<long long>(e.waited_s), " s on communicator '", comm_name_,
               "': ", e.diagnosis, "; rank ", rank_, " of ", size_, " was waiting to ",
               r.is_send ? "send to" : "receive from", " rank ", r.peer, " (world rank ", world_rank_of(comm_, r.peer),
               ") of communicator '", comm_name_, "'. Aborting the job (comm.collective_timeout_s = ", timeout_s_,
               " s)");
  else
    std::this_thread::sleep_for(std::chrono::seconds(1));  // let the reporting rank's message out first
  MPI_Abort(comm_, 1);
  std::abort();
}

// ---- workspace ---------------------------------------------------------------

void HostWorkspace::Free::operator()(void* p) const { ::operator delete(p, std::align_val_t{64}); }

void* HostWorkspace::get(std::size_t bytes) {
  if (bytes > bytes_) {
    buf_.reset();
    buf_.reset(::operator new(bytes, std::align_val_t{64}));
    bytes_ = bytes;
  }
  return buf_.get();
}

namespace {

int delete_context(MPI_Comm, int, void* value, void*) {
  delete static_cast<HostCommContext*>(value);
  return MPI_SUCCESS;
}

// The keyval is created once and never changes: the per-communicator state
// itself lives on the communicator.
int context_keyval() {
  static const int key = [] {
    int k = MPI_KEYVAL_INVALID;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_context, &k, nullptr);
    return k;
  }();
  return key;
}

}  // namespace

HostCommContext& host_context(MPI_Comm comm, int local_size) {
  int key = context_keyval();
  void* v = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm, key, &v, &found);
  if (found) return *static_cast<HostCommContext*>(v);
  auto ctx = std::make_unique<HostCommContext>();
  // As many ranks on this node as cores (or more): a waiting rank must give its
  // core back quickly, because each rank also runs a fusion-engine and a loader
  // thread, and a spinning wait steals from the computing ranks (Open MPI's
  // yield_when_idle, for the same reason). Measured: 2 ranks on 2 cores, `cnn`
  // step from 2,540 to 3,480 img/s. The cores are those this process may run
  // on (a Slurm step or taskset may give it fewer than the machine has).
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = std::max(1, CPU_COUNT(&set));
  ctx->spin_s = static_cast<unsigned>(local_size) >= cores ? 20e-6 : 5e-3;
  MPI_Comm_set_attr(comm, key, ctx.get());
  return *ctx.release();
}

}  // namespace ringtrain
