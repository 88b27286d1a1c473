#include "peer.hpp"

#include <mpi.h>

#include <cstring>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/flight_recorder.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain {
namespace {

static_assert(sizeof(MPI_Request) <= sizeof(std::uint64_t), "MPI_Request must fit a PeerRequest handle");

MPI_Request get(const PeerRequest& r) {
  MPI_Request q;
  std::memcpy(&q, &r.handle, sizeof q);
  return q;
}
void set(PeerRequest& r, MPI_Request q) { std::memcpy(&r.handle, &q, sizeof q); }

void check_bytes(std::size_t bytes) {
  RT_CHECK(bytes <= static_cast<std::size_t>(INT32_MAX), "pipeline transfer of ", bytes,
           " bytes exceeds MPI's int count (use more parallel.micro_batches)");
}

}  // namespace

PeerRequest PeerLink::isend(const void* buf, std::size_t bytes, int stage, int tag) const {
  check_bytes(bytes);
  PeerRequest r{0, stage, true, bytes};
  MPI_Request q;
  const int rc = MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, stage, tag, grid_.pp().handle("pipeline send"), &q);
  set(r, q);
  RT_CHECK(rc == MPI_SUCCESS, grid_.tag(), " MPI_Isend of ", bytes, " bytes to pipeline stage ", stage,
           " failed (MPI error ", rc, ")");
  return r;
}

PeerRequest PeerLink::irecv(void* buf, std::size_t bytes, int stage, int tag) const {
  check_bytes(bytes);
  PeerRequest r{0, stage, false, bytes};
  MPI_Request q;
  const int rc =
      MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, stage, tag, grid_.pp().handle("pipeline receive"), &q);
  set(r, q);
  RT_CHECK(rc == MPI_SUCCESS, grid_.tag(), " MPI_Irecv of ", bytes, " bytes from pipeline stage ", stage,
           " failed (MPI error ", rc, ")");
  return r;
}

// wait_bounded (comm/bounded_wait.hpp): polls back to back briefly (a
// neighbour's message usually lands within microseconds), then naps between
// polls so a waiting stage leaves the cores to the others.
void PeerLink::wait(PeerRequest& r, const std::string& what) const {
  if (!r.active()) return;
  const Communicator& pp = grid_.pp();
  const double timeout = pp.timeout_s();
  MPI_Request q = get(r);
  // The flight record shows a stage waiting on its neighbour (comm/flight_recorder.hpp).
  flight_recorder::Op rec(pp.handle("pipeline wait"), pp.name(), r.send ? "pipeline send" : "pipeline recv", r.bytes,
                          r.stage);
  try {
    const std::string w = cat(grid_.tag(), " waiting for ", what, r.send ? " to " : " from ", "pipeline stage ", r.stage);
    wait_bounded(&q, 1, WaitOn(pp.handle("pipeline wait"), timeout, pp.name(), 0), w.c_str(), OnStall::throw_error);
  } catch (const StallError& e) {
    // The peer may itself wait for a stopped rank elsewhere: e names who answers no ping, job-wide.
    log::error(grid_.tag(), " waited ", timeout, " s for ", what, r.send ? " to be received by" : " from",
               " pipeline stage ", r.stage, " (", pp.describe_rank(r.stage), "): ", e.diagnosis,
               "; ending the job (comm.collective_timeout_s = ", timeout, " s)");
    MPI_Abort(MPI_COMM_WORLD, 1);
  } catch (const Error& e) {
    RT_FAIL(e.what(), " (do the stages agree on its size?)");
  }
  rec.done();
  set(r, q);
  r.stage = -1;
}

bool PeerLink::test(PeerRequest& r) const {
  if (!r.active()) return true;
  MPI_Request q = get(r);
  int done = 0;
  check_mpi(MPI_Test(&q, &done, MPI_STATUS_IGNORE), "a pipeline transfer", "MPI_Test");
  set(r, q);
  if (done) r.stage = -1;
  return done != 0;
}

void PeerLink::cancel(PeerRequest& r) const {
  if (!r.active()) return;
  MPI_Request q = get(r);
  MPI_Cancel(&q);
  MPI_Request_free(&q);
  r.stage = -1;
}

}  // namespace ringtrain
