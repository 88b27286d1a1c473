#include "ringtrain/comm/agree.hpp"

#include <chrono>
#include <climits>
#include <thread>
#include <vector>

#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/comm/liveness.hpp"
#include "ringtrain/comm/stall_diagnosis.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain {
namespace {

// Waits like a blocking call, but a rank that never arrives (hung or stopped)
// ends the job after the communicator's collective timeout, naming that rank.
void wait_agreement(MPI_Request& req, const Communicator& comm, const char* what) {
  const double timeout = comm.timeout_s();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    int flag = 0;
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (flag) return;
    if ((i & 63) == 0) liveness::serve();
    if (i > 64) std::this_thread::sleep_for(std::chrono::microseconds(i < 1000 ? 20 : 1000));
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (timeout > 0 && waited > timeout) {
      StallDiagnosis d = diagnose_stall(comm.handle(what), stall_grace_s(timeout));
      if (comm.rank() == d.first_live)
        log::error(what, ": stalled for ", static_cast<long long>(waited), " s: ", d.describe(),
                   " on communicator '", comm.name(), "'. Aborting the job (comm.collective_timeout_s = ", timeout, " s)");
      else
        std::this_thread::sleep_for(std::chrono::seconds(1));
      MPI_Abort(comm.handle(what), 1);
    }
  }
}

}  // namespace

void agree_or_throw(const Communicator& comm, const std::string& local_error, const char* what) {
  if (!comm.valid() || comm.size() == 1) {
    if (!local_error.empty()) throw Error(local_error);
    return;
  }
  MPI_Comm c = comm.handle(what);
  int mine = local_error.empty() ? INT_MAX : comm.rank();
  int first = INT_MAX;
  MPI_Request req;
  MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c, &req);
  wait_agreement(req, comm, what);
  if (first == INT_MAX) return;
  int len = comm.rank() == first ? static_cast<int>(local_error.size()) : 0;
  MPI_Bcast(&len, 1, MPI_INT, first, c);
  std::vector<char> msg(static_cast<std::size_t>(len));
  if (comm.rank() == first) msg.assign(local_error.begin(), local_error.end());
  MPI_Bcast(msg.data(), len, MPI_CHAR, first, c);
  throw CollectiveError(cat(what, " failed on rank ", first, ": ", std::string(msg.begin(), msg.end())));
}

}  // namespace ringtrain
