#include "ringtrain/comm/liveness.hpp"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/comm/flight_recorder.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain::liveness {
namespace {

constexpr int kTagPing = 1, kTagPong = 2, kTagVerdict = 3;
const int kToken = 1;  // what pings and pongs carry; static, so a send never outlives its buffer

MPI_Comm g_comm = MPI_COMM_NULL;
std::atomic<bool> g_active{false};

// The first diagnosis to finish is sent to every rank that answered. A rank
// that asks later adopts it: by then the first asker may be ending the job and
// no longer answer pings, and must not be blamed for that.
std::mutex g_mutex;
bool g_heard_verdict = false, g_sent_verdict = false;
std::vector<int> g_verdict;  // received: the silent world ranks
std::vector<int> g_mine;     // sent: outlives its sends (never waited for)

void take_verdicts() {
  for (;;) {
    int flag = 0, n = 0;
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(MPI_ANY_SOURCE, kTagVerdict, g_comm, &flag, &msg, &st) != MPI_SUCCESS || !flag) return;
    MPI_Get_count(&st, MPI_INT, &n);
    std::vector<int> v(static_cast<std::size_t>(std::max(n, 0)));
    MPI_Mrecv(v.data(), n, MPI_INT, &msg, MPI_STATUS_IGNORE);
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_heard_verdict) g_verdict = std::move(v);
    g_heard_verdict = true;
  }
}

bool verdict(std::vector<int>& out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_heard_verdict) out = g_verdict;
  return g_heard_verdict;
}

void announce(const std::vector<int>& silent, int rank, int size) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_sent_verdict || g_heard_verdict) return;
  g_sent_verdict = true;
  g_mine = silent;
  for (int r = 0; r < size; ++r) {
    if (r == rank || std::find(silent.begin(), silent.end(), r) != silent.end()) continue;
    MPI_Request s;
    MPI_Isend(g_mine.data(), static_cast<int>(g_mine.size()), MPI_INT, r, kTagVerdict, g_comm, &s);
    MPI_Request_free(&s);
  }
}

}  // namespace

void start() {
  if (g_active.load()) return;
  // Before any configuration is read: bounded by the default collective timeout.
  MPI_Request req;
  if (MPI_Comm_idup(MPI_COMM_WORLD, &g_comm, &req) != MPI_SUCCESS) return;  // no diagnosis, training goes on
  wait_bounded(&req, 1, WaitOn(MPI_COMM_WORLD, kDefaultCollectiveTimeoutS, "world"), "starting MPI (liveness)");
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
    // A rank's wait timed out: this one, alive and waiting too, writes its record.
    flight_recorder::dump(cat("liveness ping from world rank ", st.MPI_SOURCE, " (its wait timed out)"));
  }
  take_verdicts();
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
    if (verdict(silent)) {  // another rank finished first: its answer stands
      silent.erase(std::remove(silent.begin(), silent.end(), rank), silent.end());
      for (auto& q : recvs)
        if (q != MPI_REQUEST_NULL) {
          MPI_Cancel(&q);
          MPI_Request_free(&q);
        }
      return silent;
    }
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
  announce(silent, rank, size);
  return silent;
}

}  // namespace ringtrain::liveness
