#pragma once
// The one way ringtrain waits for MPI: post the non-blocking form of a call,
// then wait_bounded(). Every MPI call that communicates goes through here
// (collectives of every algorithm, `mpi` included, host and device, through
// the ring's transport or directly; pipeline transfers; the agreement; the
// engine's control traffic; ZeRO, checkpoint and autotune traffic; start-up),
// so a rank that never arrives ends the job instead of hanging it.
// The loop:
//  - polls MPI_Testall (which also drives a non-blocking collective's progress),
//    first back to back, then for WaitOn::spin_s without giving the core away
//    (a peer preempted for a moment is back soon), then yielding the core
//    between polls, as MPI's own blocking calls do when ranks outnumber cores.
//    A wait whose peers are usually far away (the engine's control traffic, a
//    pipeline stage, ZeRO's bucket barrier) naps instead after
//    WaitOn::nap_after_s, 10 us doubling to WaitOn::max_nap_s, to leave the
//    cores to computing threads (shortest naps while *hurry is set);
//  - answers liveness pings (comm/liveness.hpp), so that a rank whose own wait
//    timed out sees this one alive, whatever it waits on;
//  - past `timeout_s` (comm.collective_timeout_s; 0 = forever) asks the job who
//    answers (diagnose_stall) and, by default, ends it: the lowest live rank of
//    the communicator logs
//      "<what>: stalled for 3 s on communicator 'dp': world rank 1 does not
//       respond (stopped, hung or dead). Aborting the job (comm.collective_timeout_s = 3 s)"
//    and every rank calls MPI_Abort. A caller with its own message or its own
//    way to end (the ring's transport, a pipeline stage, the fusion engine's
//    thread) asks for a StallError instead, which carries the diagnosis.
// Thread-safe (MPI_THREAD_MULTIPLE); the requests belong to the caller.
#include <mpi.h>

#include <atomic>
#include <string>

#include "ringtrain/core/error.hpp"

namespace ringtrain {

class Communicator;

// What a wait is on: the MPI communicator, its timeout and its name for
// messages, and how it paces its polls (see above; by default it yields and never naps).
struct WaitOn {
  static constexpr double kNever = 1e300;
  MPI_Comm comm = MPI_COMM_NULL;
  double timeout_s = 0;
  std::string name;
  double nap_after_s = kNever;
  double spin_s = 0;
  double max_nap_s = 100e-6;
  const std::atomic<bool>* hurry = nullptr;
  WaitOn(MPI_Comm c, double timeout, std::string n, double nap_after = kNever)
      : comm(c), timeout_s(timeout), name(std::move(n)), nap_after_s(nap_after) {}
  // comm.handle(what) (throws when closed), comm.timeout_s(), comm.name().
  WaitOn(const Communicator& comm, const char* what);
};

enum class OnStall { abort, throw_error };

class StallError : public Error {
 public:
  StallError(const std::string& msg, std::string diag, int first, double waited)
      : Error(msg), diagnosis(std::move(diag)), first_live(first), waited_s(waited) {}
  std::string diagnosis;  // StallDiagnosis::describe(): who does not respond
  int first_live = 0;     // the lowest live rank of the communicator: the one that reports
  double waited_s = 0;
};

// Completes reqs[0..n) or, past on.timeout_s, ends the job (abort) or throws
// StallError (throw_error), naming the ranks that do not respond. An MPI error
// is an Error naming `what`. Returns the seconds it waited after its first
// back-to-back polls (0 when those completed it). `statuses` (n of them, or
// MPI_STATUSES_IGNORE) receive the requests' statuses, e.g. a receive's length.
double wait_bounded(MPI_Request* reqs, int n, const WaitOn& on, const char* what, OnStall mode = OnStall::abort,
                    MPI_Status* statuses = MPI_STATUSES_IGNORE);

// Raises an Error "<what>: <call> failed (MPI error <rc>: <MPI's text>)" unless rc is MPI_SUCCESS.
void check_mpi(int rc, const char* what, const char* call);

// Bounded forms of the blocking calls ringtrain makes outside its own collectives:
// the non-blocking call, checked, then wait_bounded().
namespace bounded {
void allreduce(void* buf, int count, MPI_Datatype type, MPI_Op op, const WaitOn& on, const char* what);  // in place
void bcast(void* buf, int count, MPI_Datatype type, int root, const WaitOn& on, const char* what);
void barrier(const WaitOn& on, const char* what);
void allgather(const void* send, int count, MPI_Datatype type, void* recv, const WaitOn& on, const char* what);
void send(const void* buf, int count, MPI_Datatype type, int to, int tag, const WaitOn& on, const char* what);
void recv(void* buf, int count, MPI_Datatype type, int from, int tag, const WaitOn& on, const char* what);
}  // namespace bounded

}  // namespace ringtrain
