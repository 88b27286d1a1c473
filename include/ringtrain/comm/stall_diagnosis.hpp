#pragma once
// Naming the rank a stalled collective waits for. A timeout only tells a rank
// that *its* peer is late; in a ring that peer usually waits for its own
// predecessor, so the peer is the wrong one to blame. When a rank gives up, it
// sends a token (reserved tag) to every other rank of the communicator and
// collects theirs for `grace_s`: every live rank stuck in the same operation
// times out at about the same moment and answers, so the ranks that stay
// silent are the ones that never reached it (hung, stopped or dead).
// Point-to-point only (no collective call), so it cannot stall itself.
#include <mpi.h>

#include <string>
#include <vector>

namespace ringtrain {

inline constexpr int kTagStallDiagnosis = 0x52ff;
static_assert(kTagStallDiagnosis <= 32767, "within the tags every MPI accepts (kMaxMpiTag)");

// With liveness (comm/liveness.hpp) started, the diagnosis asks the whole job
// instead: `silent_world` lists every rank of MPI_COMM_WORLD that answers no
// ping, members of `comm` or not, and `silent` those among comm's ranks.
struct StallDiagnosis {
  std::vector<int> silent;        // ranks that sent no token within the grace period
  std::vector<int> silent_world;  // the same ranks in MPI_COMM_WORLD
  int first_live = 0;             // lowest rank that did (this rank counts): the one that reports
  bool global = false;            // from liveness pings over the whole job
  // "rank 2 (world rank 6) did not reach it (hung, stopped or dead)" / "every rank reached it ..."
  std::string describe() const;
};

// MPI_COMM_WORLD's rank of `rank` in `comm` (a local translation).
int world_rank_of(MPI_Comm comm, int rank);
// "world rank 3 does not respond (stopped, hung or dead)" for liveness::unresponsive's answer.
std::string describe_unresponsive(const std::vector<int>& world_ranks);

StallDiagnosis diagnose_stall(MPI_Comm comm, double grace_s);
// Grace period for a timeout of `timeout_s`: long enough for peers that entered a few seconds later.
double stall_grace_s(double timeout_s);

}  // namespace ringtrain
