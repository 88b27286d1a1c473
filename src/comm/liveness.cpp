#include "ringtrain/comm/liveness.hpp"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace ringtrain::liveness {
namespace {

constexpr int kTagPing = 1, kTagPong = 2;
const int kToken = 1;  // what pings and pongs carry; static, so a send never outlives its buffer

MPI_Comm g_comm = MPI_COMM_NULL;
std::atomic<bool> g_active{false};

}  // namespace

void start() {
  if (g_active.load()) return;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &g_comm) != MPI_SUCCESS) return;  // no diagnosis, training goes on
  MPI_Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN);
  g_active.store(true);
}

void stop() {
  if (!g_active.exchange(false)) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&g_comm);
}

bool active() { return g_active.load(std::memory_order_relaxed); }

void serve() {
  if (!active()) return;
  for (;;) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(MPI_ANY_SOURCE, kTagPing, g_comm, &flag, &msg, &st) != MPI_SUCCESS || !flag) return;
    int token = 0;
    MPI_Mrecv(&token, 1, MPI_INT, &msg, MPI_STATUS_IGNORE);
    MPI_Request r;  // never waited for: the asker is about to end the job
    MPI_Isend(&kToken, 1, MPI_INT, st.MPI_SOURCE, kTagPong, g_comm, &r);
    MPI_Request_free(&r);
  }
}

std::vector<int> unresponsive(double grace_s) {
  std::vector<int> silent;
  if (!active()) return silent;
  int rank = 0, size = 1;
  MPI_Comm_rank(g_comm, &rank);
  MPI_Comm_size(g_comm, &size);
  std::vector<int> pong(static_cast<std::size_t>(size), -1);
  std::vector<MPI_Request> recvs(static_cast<std::size_t>(size), MPI_REQUEST_NULL);
  std::vector<char> heard(static_cast<std::size_t>(size), 0);
  heard[static_cast<std::size_t>(rank)] = 1;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    MPI_Request s;
    MPI_Isend(&kToken, 1, MPI_INT, r, kTagPing, g_comm, &s);
    MPI_Request_free(&s);
    MPI_Irecv(&pong[static_cast<std::size_t>(r)], 1, MPI_INT, r, kTagPong, g_comm, &recvs[static_cast<std::size_t>(r)]);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    serve();  // others may be asking at the same moment
    bool all = true;
    for (int r = 0; r < size; ++r) {
      if (heard[static_cast<std::size_t>(r)]) continue;
      int flag = 0;
      MPI_Test(&recvs[static_cast<std::size_t>(r)], &flag, MPI_STATUS_IGNORE);
      heard[static_cast<std::size_t>(r)] = static_cast<char>(flag);
      all = all && flag;
    }
    if (all || std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > grace_s) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < size; ++r)
    if (!heard[static_cast<std::size_t>(r)]) {
      silent.push_back(r);
      MPI_Cancel(&recvs[static_cast<std::size_t>(r)]);
      MPI_Request_free(&recvs[static_cast<std::size_t>(r)]);
    }
  return silent;
}

}  // namespace ringtrain::liveness
