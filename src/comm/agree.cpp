#include "ringtrain/comm/agree.hpp"

#include <climits>
#include <vector>

#include "ringtrain/core/error.hpp"

namespace ringtrain {

void agree_or_throw(const Communicator& comm, const std::string& local_error, const char* what) {
  if (!comm.valid() || comm.size() == 1) {
    if (!local_error.empty()) throw Error(local_error);
    return;
  }
  MPI_Comm c = comm.handle(what);
  int mine = local_error.empty() ? INT_MAX : comm.rank();
  int first = INT_MAX;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c);
  if (first == INT_MAX) return;
  int len = comm.rank() == first ? static_cast<int>(local_error.size()) : 0;
  MPI_Bcast(&len, 1, MPI_INT, first, c);
  std::vector<char> msg(static_cast<std::size_t>(len));
  if (comm.rank() == first) msg.assign(local_error.begin(), local_error.end());
  MPI_Bcast(msg.data(), len, MPI_CHAR, first, c);
  throw CollectiveError(cat(what, " failed on rank ", first, ": ", std::string(msg.begin(), msg.end())));
}

}  // namespace ringtrain
