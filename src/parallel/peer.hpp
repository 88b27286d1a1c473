#pragma once
// Point-to-point transfers between the stages of a pipeline (the grid's pp()
// communicator). Every wait, for a send or a receive, is bounded by that
// communicator's timeout: a stage that died or stalled ends the job with a
// message naming it (stage and world rank) instead of hanging its neighbours.
#include <cstdint>
#include <string>

#include "ringtrain/parallel/grid.hpp"

namespace ringtrain {

// Tags on pp(): micro-batch transfers use [0, kMaxTransferTag]; MPI guarantees
// tags up to 32767 only.
inline constexpr int kMaxTransferTag = 32000;
inline constexpr int kTagEvalSize = 32001;
inline constexpr int kTagEvalActivation = 32002;
inline constexpr int kTagShapeHandshake = 32003;
inline constexpr int kTagLinkProbe = 32004;  // ScheduleExecutor::measure_link

struct PeerRequest {
  std::uint64_t handle = 0;  // an MPI_Request (the header stays MPI-free)
  int stage = -1;            // the peer's pipeline stage; -1 = no request
  bool send = false;
  std::size_t bytes = 0;
  bool active() const { return stage >= 0; }
};

class PeerLink {
 public:
  explicit PeerLink(const ProcessGrid& grid) : grid_(grid) {}
  PeerRequest isend(const void* buf, std::size_t bytes, int stage, int tag) const;
  PeerRequest irecv(void* buf, std::size_t bytes, int stage, int tag) const;
  // Waits for r; past the timeout the job ends naming the peer and `what`.
  void wait(PeerRequest& r, const std::string& what) const;
  // Whether r has completed (or is no request), without waiting; drives MPI's progress.
  bool test(PeerRequest& r) const;
  // Cancels a receive nobody will match (teardown).
  void cancel(PeerRequest& r) const;

 private:
  const ProcessGrid& grid_;
};

}  // namespace ringtrain
