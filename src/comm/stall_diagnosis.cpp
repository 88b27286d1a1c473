#include "ringtrain/comm/stall_diagnosis.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "ringtrain/comm/liveness.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain {

double stall_grace_s(double timeout_s) { return std::clamp(timeout_s / 10, 5.0, 30.0); }

StallDiagnosis diagnose_stall(MPI_Comm comm, double grace_s) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  StallDiagnosis d;
  if (liveness::active()) {
    // The job's view: the ranks that answer no ping, wherever they are.
    d.silent_world = liveness::unresponsive(grace_s);
    d.global = true;
    d.first_live = size;
    for (int r = 0; r < size; ++r) {
      const int w = world_rank_of(comm, r);
      if (std::find(d.silent_world.begin(), d.silent_world.end(), w) != d.silent_world.end()) d.silent.push_back(r);
      else d.first_live = std::min(d.first_live, r);
    }
    return d;
  }
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
    if (!heard[static_cast<std::size_t>(r)]) {
      d.silent.push_back(r);
      d.silent_world.push_back(world_rank_of(comm, r));
    } else {
      d.first_live = std::min(d.first_live, r);
    }
  }
  return d;
}

std::string describe_unresponsive(const std::vector<int>& w) {
  if (w.empty()) return "every rank of the job answers: the ranks disagree on the operation (count, dtype or order)";
  std::string s = w.size() == 1 ? "world rank " : "world ranks ";
  for (std::size_t i = 0; i < w.size(); ++i) s += cat(i ? ", " : "", w[i]);
  return s + (w.size() == 1 ? " does" : " do") + " not respond (stopped, hung or dead)";
}

int world_rank_of(MPI_Comm comm, int rank) {
  MPI_Group mine, world;
  MPI_Comm_group(comm, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int out = MPI_UNDEFINED;
  MPI_Group_translate_ranks(mine, 1, &rank, world, &out);
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  return out;
}

std::string StallDiagnosis::describe() const {
  if (global) return describe_unresponsive(silent_world);
  if (silent.empty())
    return "every rank reached it: the ranks disagree on the operation (count, dtype or order)";
  std::string s = silent.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < silent.size(); ++i) {
    s += cat(i ? ", " : "", silent[i]);
    if (i < silent_world.size()) s += cat(" (world rank ", silent_world[i], ")");
  }
  return s + " did not reach it (hung, stopped or dead)";
}

}  // namespace ringtrain
