#pragma once
// Flight recorder: every rank keeps its last N communication operations
// (communicator, operation, bytes, peer, the communicator's sequence number,
// start/end time, state) in a ring buffer, and writes them out when the job
// goes wrong, so that `ringtrain diagnose DIR` can name the first operation on
// which the ranks disagree: the rank that never entered it, or entered another.
//
// What is recorded: each public collective (allreduce, broadcast, allgather(v),
// reduce_scatter, alltoall(v)) and each bounded:: call (comm/bounded_wait.hpp:
// the agreement, start-up, the engine's control traffic, checkpoint and ZeRO
// traffic; bounded::send/recv as point-to-point with their peer). Collectives
// are numbered per communicator (#1, #2, ...; every rank of a communicator
// issues them in the same order), point-to-point operations are not numbered.
//
// When it is written (each rank to DIR/rank<world rank>.jsonl, overwritten by a
// later dump of the same process):
//  - a wait that timed out (wait_bounded's stall path), before the diagnosis;
//  - a liveness ping (comm/liveness.hpp): a rank whose wait timed out pings
//    every rank, so every live rank that is itself waiting writes its record
//    too, before the first rank ends the job;
//  - a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT), from the
//    handler (async-signal-safe writes only), then the previous handler runs.
// A stall's diagnosis (who does not respond) stays in the reason of every later
// record of the process (dump's `diagnosis`).
//
// Cost on the hot path: one MPI attribute lookup, one atomic increment, two
// clock reads and a few stores into a preallocated slot; no lock, no allocation
// (bench/comm_allreduce_sweep --flight-recorder measures it). Off (the default
// until configure()) it is one relaxed atomic load.
//
// One recorder per process, like liveness: the signal handler and every wait
// loop must reach it without a context argument.
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ringtrain::flight_recorder {

// Starts recording the last `entries` operations (rounded up to a power of two;
// 0 turns it off) and dumping into `dir` ("" = record but never write; made at
// the first dump, inside an existing parent). Call once, on every rank, before
// the communication to record; later calls are ignored (the first run of a
// process chooses the directory). A record of an earlier run there is removed.
void configure(const std::string& dir, std::size_t entries);
bool enabled();
// Stops (true) or resumes recording after configure(): for measuring the
// recorder's cost against itself in one run (bench/comm_flight_recorder_overhead).
void suspend(bool suspended);
const std::string& dir();

// One recorded operation, from construction to done() (or destruction: then
// "failed" when an exception is unwinding, else done). peer < 0: a collective.
class Op {
 public:
  Op(MPI_Comm comm, const std::string& comm_name, const char* op, std::size_t bytes, int peer = -1);
  ~Op();
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;
  void done();

 private:
  void* slot_ = nullptr;
  std::uint64_t id_ = 0;
  int exceptions_ = 0;
  // The step window's trace (core/trace.hpp), independent of the recorder.
  std::string trace_name_;
  std::size_t trace_bytes_ = 0;
  std::chrono::steady_clock::time_point trace_t0_;
};

// Writes this rank's record now (reason: why, e.g. "stall in allreduce").
// Thread-safe; a no-op when recording is off or no directory was given.
// diagnosis: the reason names who does not respond; it is kept, and every later
// record of this process (another thread's stall, a fatal signal while MPI_Abort
// tears the job down) carries it first, its own reason after "; later: ".
void dump(const std::string& reason, bool diagnosis = false);

// Reads the records in `dir` and describes the first operation on which the
// ranks disagree, per communicator (what `ringtrain diagnose DIR` prints).
// Throws Error when `dir` holds no record.
std::string diagnose(const std::string& dir);

}  // namespace ringtrain::flight_recorder
