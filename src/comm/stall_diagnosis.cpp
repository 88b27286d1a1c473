#include "ringtrain/comm/stall_diagnosis.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "ringtrain/core/error.hpp"

namespace ringtrain {

double stall_grace_s(double timeout_s) { return std::clamp(timeout_s / 10, 5.0, 30.0); }

StallDiagnosis diagnose_stall(MPI_Comm comm, double grace_s) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  StallDiagnosis d;
  if (size == 1) return d;
  // Tokens are sent and never waited for: a stopped peer never takes them, and
  // the job ends right after this anyway.
  std::vector<int> token(static_cast<std::size_t>(size), rank), got(static_cast<std::size_t>(size), -1);
  std::vector<MPI_Request> recvs(static_cast<std::size_t>(size), MPI_REQUEST_NULL);
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    MPI_Request s;
    MPI_Isend(&token[static_cast<std::size_t>(r)], 1, MPI_INT, r, kTagStallDiagnosis, comm, &s);
    MPI_Request_free(&s);
    MPI_Irecv(&got[static_cast<std::size_t>(r)], 1, MPI_INT, r, kTagStallDiagnosis, comm, &recvs[static_cast<std::size_t>(r)]);
  }
  std::vector<bool> heard(static_cast<std::size_t>(size), false);
  heard[static_cast<std::size_t>(rank)] = true;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    bool all = true;
    for (int r = 0; r < size; ++r) {
      auto& q = recvs[static_cast<std::size_t>(r)];
      if (heard[static_cast<std::size_t>(r)]) continue;
      int flag = 0;
      MPI_Test(&q, &flag, MPI_STATUS_IGNORE);
      if (flag) heard[static_cast<std::size_t>(r)] = true;
      else all = false;
    }
    if (all || std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > grace_s) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  d.first_live = rank;
  for (int r = 0; r < size; ++r) {
    if (!heard[static_cast<std::size_t>(r)]) d.silent.push_back(r);
    else d.first_live = std::min(d.first_live, r);
  }
  return d;
}

std::string StallDiagnosis::describe() const {
  if (silent.empty())
    return "every rank reached it: the ranks disagree on the operation (count, dtype or order)";
  std::string s = silent.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < silent.size(); ++i) s += cat(i ? ", " : "", silent[i]);
  return s + (silent.size() == 1 ? " did" : " did") + " not reach it (hung, stopped or dead)";
}

}  // namespace ringtrain
