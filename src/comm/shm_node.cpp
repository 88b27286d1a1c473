// Setting up and tearing down the node-aware algorithms' shared memory, and the
// one wait of their data path (see include/ringtrain/comm/shm.hpp).
#include "shm_node.hpp"

#include <fcntl.h>
#include <mpi.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/flight_recorder.hpp"
#include "ringtrain/comm/liveness.hpp"
#include "ringtrain/comm/stall_diagnosis.hpp"
#include "ringtrain/comm/shm.hpp"
#include "ringtrain/core/cpu.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain::shm_detail {
namespace {

// Slots hold whole 4 KiB pages; the one-round path fits one slot.
std::size_t slot_bytes_of(const CollectiveOptions& o) {
  return ((o.shm_chunk_bytes ? o.shm_chunk_bytes : kDefaultShmChunkBytes) + 4095) / 4096 * 4096;
}
std::size_t small_bytes_of(const CollectiveOptions& o) {
  return std::min(o.shm_small_bytes ? o.shm_small_bytes : kDefaultShmSmallBytes, slot_bytes_of(o));
}

// A process that has exited (gone, or a zombie its parent has not reaped yet).
bool process_gone(int pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return true;
  std::string line;
  std::getline(f, line);
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && (line[close + 2] == 'Z' || line[close + 2] == 'X');
}

int delete_node(MPI_Comm, int, void* value, void*) {
  delete static_cast<ShmNode*>(value);
  return MPI_SUCCESS;
}

int node_keyval() {
  static const int key = [] {
    int k = MPI_KEYVAL_INVALID;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_node, &k, nullptr);
    return k;
  }();
  return key;
}

// Every rank learns whether any rank failed; the failing ranks throw their own
// message, the others one that names the first failing rank.
void agree(const WaitOn& on, int rank, const std::string& error, const char* what, const std::string& comm_name) {
  int first = error.empty() ? INT32_MAX : rank;
  bounded::allreduce(&first, 1, MPI_INT, MPI_MIN, on, what);
  if (!error.empty()) throw Error(error);
  RT_CHECK(first == INT32_MAX, what, ": rank ", first, " of communicator '", comm_name,
           "' could not set up its shared memory (its error says why)");
}

std::atomic<unsigned> g_serial{0};  // segment names within this process (the pid makes them unique per machine)

}  // namespace

ShmNode::~ShmNode() {
  for (char* b : base)
    if (b) ::munmap(b, seg_bytes);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized)
    for (MPI_Comm& c : slice_comm)
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
}

void ShmNode::wait_peers(const char* what) const {
  using clock = std::chrono::steady_clock;
  const std::uint64_t target = step;
  for (int j = 0; j < lsize; ++j) {
    if (j == lrank) continue;
    auto& s = seq(j);
    unsigned i = 0;
    for (; i < 1024; ++i) {
      if (s.load(std::memory_order_acquire) >= target) break;
      cpu_relax();
    }
    if (i < 1024) continue;
    // Slow path: against the clock, yielding once the spin budget is spent,
    // checking now and then that the peer is alive.
    auto start = clock::now(), last_check = start;
    bool yielding = false, sleeping = false;
    for (unsigned k = 1; s.load(std::memory_order_acquire) < target; ++k) {
      if (sleeping) std::this_thread::sleep_for(std::chrono::microseconds(20));
      else if (yielding) sched_yield();
      else cpu_relax();
      if (!sleeping && k % 64 != 0) continue;
      liveness::serve();
      auto now = clock::now();
      double waited = std::chrono::duration<double>(now - start).count();
      if (waited > spin_s) {
        yielding = true;
        // Drive MPI's progress engine while waiting: the peer may be blocked on a
        // non-blocking message of ours that only progresses inside MPI (a pipeline
        // stage's Isend of an activation or gradient, posted before this all-reduce);
        // without this the two wait for each other forever.
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
      }
      // A peer this late is descheduled or busy elsewhere: stop competing for its core.
      if (waited > spin_s + 2e-3) sleeping = true;
      if (std::chrono::duration<double>(now - last_check).count() > 0.05) {
        last_check = now;
        if (s.load(std::memory_order_acquire) >= target) break;
        if (process_gone(pid[j])) {
          flight_recorder::dump(cat(what, ": world rank ", world_rank[j], " died during a shared-memory all-reduce"));
          log::error(what, ": rank ", comm_rank[j], " (world rank ", world_rank[j], ") of communicator '", comm_name,
                     "' (pid ", pid[j],
                     " on this node) died during a shared-memory all-reduce (rank ", comm_rank[lrank], " of ",
                     size, " waited ", static_cast<long long>(waited * 1000), " ms). Aborting the job");
          MPI_Abort(MPI_COMM_WORLD, 70);
          std::abort();
        }
      }
      if (timeout_s > 0 && waited > timeout_s) {
        flight_recorder::dump(cat(what, ": stalled for ", static_cast<long long>(waited), " s on communicator '",
                                  comm_name, "' (shared memory)"));
        // The late peer may itself wait for a stopped rank elsewhere: ask the job who answers.
        const std::string who = liveness::active()
                                    ? describe_unresponsive(liveness::unresponsive(stall_grace_s(timeout_s)))
                                    : "a rank is missing from the collective or passed a different count";
        flight_recorder::dump(cat(what, ": stalled for ", static_cast<long long>(waited), " s on communicator '",
                                  comm_name, "' (shared memory): ", who),
                              /*diagnosis=*/true);
        log::error(what, ": stalled for ", static_cast<long long>(waited), " s waiting for rank ", comm_rank[j],
                   " (world rank ", world_rank[j], ") of communicator '", comm_name,
                   "' in a shared-memory all-reduce (rank ", comm_rank[lrank], " of ", size, " is at step ", target,
                   ", rank ", comm_rank[j], " at ", s.load(std::memory_order_acquire), "): ", who,
                   ". Aborting the job (comm.collective_timeout_s = ", timeout_s, " s)");
        MPI_Abort(MPI_COMM_WORLD, 70);
        std::abort();
      }
    }
  }
}

ShmNode& shm_node(const Communicator& comm, const char* what, const CollectiveOptions& opt) {
  MPI_Comm h = comm.handle(what);
  int key = node_keyval();
  void* v = nullptr;
  int found = 0;
  MPI_Comm_get_attr(h, key, &v, &found);
  if (found) {
    // The options agree on every rank (like the segment size), so every rank raises this alike.
    ShmNode& n = *static_cast<ShmNode*>(v);
    RT_CHECK((!opt.shm_chunk_bytes || slot_bytes_of(opt) == n.slot_bytes) &&
                 (!opt.shm_small_bytes || small_bytes_of(opt) == n.small_bytes),
             what, ": communicator '", comm.name(), "' set up its shared memory with ", n.slot_bytes,
             "-byte slots and a one-round limit of ", n.small_bytes, " bytes; this call asks for shm_chunk_bytes = ",
             opt.shm_chunk_bytes, ", shm_small_bytes = ", opt.shm_small_bytes, " (use a new communicator)");
    return n;
  }

  auto node = std::make_unique<ShmNode>();
  ShmNode& n = *node;
  HostCommContext& ctx = host_context(h, comm.local_size());
  n.timeout_s = comm.timeout_s();
  n.spin_s = ctx.spin_s;
  n.comm_name = comm.name();
  n.size = comm.size();
  n.slices = comm.max_local_size();
  int rank = comm.rank();
  std::string error;
  n.slot_bytes = slot_bytes_of(opt);
  n.small_bytes = small_bytes_of(opt);
  n.seg_bytes = kHeaderBytes + 2 * n.slot_bytes;

  // MPI_Comm_split* have no non-blocking form: a bounded barrier first, so a
  // rank that never comes ends the job here instead of hanging the split.
  const WaitOn on(comm, what);
  bounded::barrier(on, what);
  MPI_Comm local;
  MPI_Comm_split_type(h, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &n.lrank);
  MPI_Comm_size(local, &n.lsize);

  // 1. Each rank creates, sizes and touches its own segment (its pages are then local to it).
  // The serial is taken once: engines on other communicators may set up concurrently.
  const unsigned serial = g_serial.fetch_add(1);
  std::string name = cat("/ringtrain-", ::getpid(), "-", serial);
  n.base.assign(n.lsize, nullptr);
  if (error.empty()) {
    int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      error = cat(what, ": cannot create shared-memory segment ", name, ": ", std::strerror(errno));
    } else {
      if (::ftruncate(fd, static_cast<off_t>(n.seg_bytes)) != 0)
        error = cat(what, ": cannot size shared-memory segment ", name, " to ", n.seg_bytes, " bytes: ",
                    std::strerror(errno));
      void* p = error.empty() ? ::mmap(nullptr, n.seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
      ::close(fd);
      if (p == MAP_FAILED) {
        if (error.empty()) error = cat(what, ": cannot map shared-memory segment ", name, ": ", std::strerror(errno));
        ::shm_unlink(name.c_str());
      } else {
        n.base[n.lrank] = static_cast<char*>(p);
        std::memset(p, 0, n.seg_bytes);  // touches every page now, not inside a timed collective
        new (p) std::atomic<std::uint64_t>(0);
      }
    }
  }
  // 2. The node's ranks exchange (pid, serial, comm rank) and map each other's segments.
  struct Id { int pid, serial, rank, ok; };
  Id mine{static_cast<int>(::getpid()), static_cast<int>(serial), rank, error.empty() ? 1 : 0};
  std::vector<Id> ids(n.lsize);
  bounded::allgather(&mine, sizeof(Id), MPI_BYTE, ids.data(), WaitOn(local, on.timeout_s, on.name + " (node)"), what);
  MPI_Comm_free(&local);
  for (int j = 0; j < n.lsize; ++j) {
    n.pid.push_back(ids[j].pid);
    n.comm_rank.push_back(ids[j].rank);
    n.world_rank.push_back(comm.world_rank(ids[j].rank));
    if (j == n.lrank || !ids[j].ok || !error.empty()) continue;
    std::string peer = cat("/ringtrain-", ids[j].pid, "-", ids[j].serial);
    int fd = ::shm_open(peer.c_str(), O_RDWR, 0);
    void* p = fd < 0 ? MAP_FAILED : ::mmap(nullptr, n.seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) ::close(fd);
    if (p == MAP_FAILED) error = cat(what, ": cannot map rank ", ids[j].rank, "'s shared-memory segment ", peer, ": ",
                                     std::strerror(errno));
    else n.base[j] = static_cast<char*>(p);
  }
  // 3. Once every rank has attached (or failed), the names go: from here no exit
  //    path can leave a segment behind.
  int dummy = 0;
  bounded::allreduce(&dummy, 1, MPI_INT, MPI_SUM, on, what);
  if (n.base[n.lrank]) ::shm_unlink(name.c_str());
  // 4. Inter-node groups: slice s is owned on every node by local index s mod (node size).
  n.slice_comm.assign(n.slices, MPI_COMM_NULL);
  if (comm.node_count() > 1)
    for (int s = 0; s < n.slices; ++s)
      MPI_Comm_split(h, n.lrank == s % n.lsize ? 0 : MPI_UNDEFINED, rank, &n.slice_comm[s]);
  n.block.resize(16 * 1024 + 64);
  agree(on, rank, error, what, n.comm_name);
  MPI_Comm_set_attr(h, key, node.get());
  return *node.release();
}

}  // namespace ringtrain::shm_detail
