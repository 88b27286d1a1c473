#include "ringtrain/comm/bounded_wait.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/comm/flight_recorder.hpp"
#include "ringtrain/comm/liveness.hpp"
#include "ringtrain/comm/stall_diagnosis.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain {
namespace {

using Clock = std::chrono::steady_clock;

// Polls back to back first: a short message or collective usually completes
// within microseconds, and reading the clock, yielding or sleeping would add
// latency to it. Pings are answered and the clock read every kCheckEvery polls
// after that (one MPI_Improbe each), or at every poll once napping.
// Measured (2 ranks, 2 shared cores, MPI_Iallreduce of 256 KiB): napping after
// 20 us took 4.0x MPI's blocking MPI_Allreduce, yielding 1.8x; so data waits
// yield, and only waits on far-away peers nap.
// A wait paced from the start (WaitOn::nap_after_s <= 0: the engine's control
// traffic, ZeRO's bucket barrier) is on peers usually a whole cycle away, on a
// thread beside the computing one: it yields between its first polls instead
// (kPacedPolls, the engine's pacing before the bounded wait). 256 tight polls
// there took the core from the computation every engine cycle: cnn at data 2
// ran at 0.94x its earlier images/s (docs/data/mesh_waits_throughput_ab.txt).
constexpr unsigned kTightPolls = 256, kPacedPolls = 32, kCheckEvery = 16;

[[noreturn]] void stalled(const WaitOn& on, const char* what, double waited, OnStall mode) {
  // This rank's last operations first (comm/flight_recorder.hpp): the diagnosis
  // pings every rank, and each live one writes its own as it answers.
  flight_recorder::dump(cat(what, ": stalled for ", static_cast<long long>(waited), " s on communicator '", on.name, "'"));
  // The rank we wait for may itself wait for another one: ask the job who answers.
  const StallDiagnosis d = diagnose_stall(on.comm, stall_grace_s(on.timeout_s));
  const std::string head = cat(what, ": stalled for ", static_cast<long long>(waited), " s on communicator '", on.name,
                               "': ", d.describe());
  flight_recorder::dump(head, /*diagnosis=*/true);  // again, with the diagnosis, kept in later records
  if (mode == OnStall::throw_error)
    throw StallError(cat(head, " (comm.collective_timeout_s = ", on.timeout_s, " s)"), d.describe(), d.first_live,
                     waited);
  const std::string msg = cat(head, ". Aborting the job (comm.collective_timeout_s = ", on.timeout_s, " s)");
  int rank = 0;
  MPI_Comm_rank(on.comm, &rank);
  if (rank == d.first_live) log::error(msg);
  else std::this_thread::sleep_for(std::chrono::seconds(1));  // let the reporting rank's message out first
  MPI_Abort(on.comm, 1);
  std::abort();
}

}  // namespace

WaitOn::WaitOn(const Communicator& c, const char* what) : comm(c.handle(what)), timeout_s(c.timeout_s()), name(c.name()) {}

void check_mpi(int rc, const char* what, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  RT_FAIL(what, ": ", call, " failed (MPI error ", rc, ": ", std::string(text, static_cast<std::size_t>(len)),
          "; do all ranks pass the same count and type?)");
}

double wait_bounded(MPI_Request* reqs, int n, const WaitOn& on, const char* what, OnStall mode,
                    MPI_Status* statuses) {
  int done = 0;
  const bool paced = on.nap_after_s <= 0;
  for (unsigned i = 0; i < (paced ? kPacedPolls : kTightPolls); ++i) {
    check_mpi(MPI_Testall(n, reqs, &done, statuses), what, "MPI_Testall");
    if (done) return 0;
    if (paced) std::this_thread::yield();
  }
  const auto t0 = Clock::now();
  auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  bool yielding = on.spin_s <= 0, napping = on.nap_after_s <= 0;
  const auto max_nap = std::chrono::duration<double>(on.max_nap_s);
  auto nap = std::chrono::duration<double>(10e-6);
  for (unsigned i = 1;; ++i) {
    check_mpi(MPI_Testall(n, reqs, &done, statuses), what, "MPI_Testall");
    if (done) return since();
    if (napping || i % kCheckEvery == 0) {
      liveness::serve();
      const double waited = since();
      if (on.timeout_s > 0 && waited > on.timeout_s) stalled(on, what, waited, mode);
      yielding = yielding || waited >= on.spin_s;
      napping = napping || waited >= on.nap_after_s;
    }
    if (napping) {
      const bool urgent = on.hurry && on.hurry->load(std::memory_order_relaxed);
      std::this_thread::sleep_for(urgent ? std::chrono::duration<double>(10e-6) : nap);
      nap = std::min(nap * 2, max_nap);
    } else if (yielding) {
      std::this_thread::yield();
    }
  }
}

namespace bounded {

static std::size_t type_bytes(MPI_Datatype type, int count) {
  int size = 0;
  MPI_Type_size(type, &size);
  return static_cast<std::size_t>(size) * static_cast<std::size_t>(count);
}

void allreduce(void* buf, int count, MPI_Datatype type, MPI_Op op, const WaitOn& on, const char* what) {
  flight_recorder::Op rec(on.comm, on.name, what, type_bytes(type, count));
  MPI_Request r;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, op, on.comm, &r), what, "MPI_Iallreduce");
  wait_bounded(&r, 1, on, what);
}

void bcast(void* buf, int count, MPI_Datatype type, int root, const WaitOn& on, const char* what) {
  flight_recorder::Op rec(on.comm, on.name, what, type_bytes(type, count));
  MPI_Request r;
  check_mpi(MPI_Ibcast(buf, count, type, root, on.comm, &r), what, "MPI_Ibcast");
  wait_bounded(&r, 1, on, what);
}

void barrier(const WaitOn& on, const char* what) {
  flight_recorder::Op rec(on.comm, on.name, what, 0);
  MPI_Request r;
  check_mpi(MPI_Ibarrier(on.comm, &r), what, "MPI_Ibarrier");
  wait_bounded(&r, 1, on, what);
}

void allgather(const void* send, int count, MPI_Datatype type, void* recv, const WaitOn& on, const char* what) {
  flight_recorder::Op rec(on.comm, on.name, what, type_bytes(type, count));
  MPI_Request r;
  check_mpi(MPI_Iallgather(send, count, type, recv, count, type, on.comm, &r), what, "MPI_Iallgather");
  wait_bounded(&r, 1, on, what);
}

void send(const void* buf, int count, MPI_Datatype type, int to, int tag, const WaitOn& on, const char* what) {
  flight_recorder::Op rec(on.comm, on.name, what, type_bytes(type, count), to);
  MPI_Request r;
  check_mpi(MPI_Isend(buf, count, type, to, tag, on.comm, &r), what, "MPI_Isend");
  wait_bounded(&r, 1, on, what);
}

void recv(void* buf, int count, MPI_Datatype type, int from, int tag, const WaitOn& on, const char* what) {
  flight_recorder::Op rec(on.comm, on.name, what, type_bytes(type, count), from);
  MPI_Request r;
  check_mpi(MPI_Irecv(buf, count, type, from, tag, on.comm, &r), what, "MPI_Irecv");
  wait_bounded(&r, 1, on, what);
}

}  // namespace bounded
}  // namespace ringtrain
