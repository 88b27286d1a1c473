#pragma once
// Which processes of the job still run, for naming the rank a stall waits on.
//
// A timeout tells a rank only that *its* peer is late, and that peer often
// waits for a third rank on another communicator (a tensor group waits for a
// stopped rank, its data-parallel peers wait for the tensor group). So every
// wait loop of ringtrain (collectives, agreement, pipeline transfers, the
// fusion engine's cycle, shared-memory waits) calls serve(), which answers
// pings on a private duplicate of MPI_COMM_WORLD (comm/bounded_wait.hpp does,
// for every MPI wait). A rank whose wait timed out
// pings every rank of the job: the ones that do not answer within the grace
// period are stopped, dead, or stuck outside ringtrain's waits. Point-to-point
// only (no collective), so it cannot stall itself.
//
// start() is collective over MPI_COMM_WORLD (MpiRuntime calls it once after
// MPI_Init); before it, or when MPI was initialised by someone else, active()
// is false and stall diagnosis falls back to the communicator's own ranks.
#include <vector>

namespace ringtrain::liveness {

void start();
void stop();  // before MPI_Finalize
bool active();
// Answers the pings that have arrived (one MPI_Improbe when there are none).
// Thread-safe; cheap enough for a wait loop's slow path.
void serve();
// World ranks that did not answer a ping within grace_s (this rank never counts).
// The first rank to finish sends its answer to every rank that answered it; a
// rank still asking adopts that answer, since the first may be ending the job by
// then and no longer answer pings.
std::vector<int> unresponsive(double grace_s);

}  // namespace ringtrain::liveness
