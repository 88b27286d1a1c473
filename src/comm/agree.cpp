#include "ringtrain/comm/agree.hpp"

#include <climits>
#include <vector>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain {

void agree_or_throw(const Communicator& comm, const std::string& local_error, const char* what) {
  if (!comm.valid() || comm.size() == 1) {
    if (!local_error.empty()) throw Error(local_error);
    return;
  }
  // Waits like a blocking call, but a rank that never arrives (hung or stopped)
  // ends the job after the communicator's collective timeout, naming that rank.
  const WaitOn on(comm, what);
  int mine = local_error.empty() ? INT_MAX : comm.rank();
  int first = INT_MAX;
  MPI_Request req;
  check_mpi(MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, on.comm, &req), what, "MPI_Iallreduce");
  wait_bounded(&req, 1, on, what);
  if (first == INT_MAX) return;
  int len = comm.rank() == first ? static_cast<int>(local_error.size()) : 0;
  bounded::bcast(&len, 1, MPI_INT, first, on, what);
  std::vector<char> msg(static_cast<std::size_t>(len));
  if (comm.rank() == first) msg.assign(local_error.begin(), local_error.end());
  bounded::bcast(msg.data(), len, MPI_CHAR, first, on, what);
  throw CollectiveError(cat(what, " failed on rank ", first, ": ", std::string(msg.begin(), msg.end())));
}

}  // namespace ringtrain
