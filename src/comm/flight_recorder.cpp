// The flight recorder's ring buffer and its dump (comm/flight_recorder.hpp).
// Slots are claimed with one atomic increment and published seqlock-style (id
// 0 while written, then the claim number + 1), so a dump taken while other
// threads record skips a slot it would read half-written. The dump uses only
// async-signal-safe calls (open, write, rename, clock_gettime), so that the
// fatal-signal handler can run it.
#include "ringtrain/comm/flight_recorder.hpp"

#include "ringtrain/core/trace.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <csignal>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>

#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain::flight_recorder {
namespace {

constexpr int kOpChars = 48, kNameChars = 32, kMaxComms = 256, kMaxMembers = 256;
enum State : std::uint8_t { kStarted = 1, kDone = 2, kFailed = 3 };

struct alignas(64) Slot {  // two whole cache lines
  std::atomic<std::uint64_t> id{0};  // claim number + 1 once written; 0 while being written
  std::uint64_t seq = 0;             // the communicator's collective number (0: point-to-point)
  std::int64_t bytes = 0, start_ns = 0;
  std::atomic<std::int64_t> end_ns{0};
  std::int32_t peer = -1, comm = -1;
  std::atomic<std::uint8_t> state{0};
  char op[kOpChars] = {};
};

struct CommDesc {
  char name[kNameChars];
  int size, members;
  int world[kMaxMembers];  // world ranks of the first kMaxMembers ranks
};

// The MPI attribute on each recorded communicator.
struct CommInfo {
  int index = -1;
  std::atomic<std::uint64_t> seq{0};
};

struct Recorder {
  std::size_t n = 0;  // a power of two: a slot is claim & (n - 1), no division
  std::unique_ptr<Slot[]> slots;
  std::atomic<std::uint64_t> next{0};
  CommDesc comms[kMaxComms];
  std::atomic<int> ncomms{0};
  std::mutex comm_mu, dump_mu;
  std::string dir;
  char path[4096] = {}, tmp[4096] = {}, dir_path[4096] = {};
  int world_rank = 0, world_size = 1, keyval = MPI_KEYVAL_INVALID;
  char kept[512] = {};  // a stall's diagnosis, first in every later record's reason (set under dump_mu)
};

// Lives until the process ends (the signal handler may read it at any time).
std::atomic<Recorder*> g_rec{nullptr};
const std::string g_no_dir;
volatile std::sig_atomic_t g_in_handler = 0, g_dumped = 0;
constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
struct sigaction g_old[sizeof kSignals / sizeof kSignals[0]];

// Comparable between the ranks of one machine. The operations' times use the
// coarse clock (the kernel's tick, 1-4 ms): 5 ns a read against 45 for the
// precise one, which was half of the recorder's cost (perf, 2 ranks).
std::int64_t now_ns(clockid_t clock = CLOCK_REALTIME_COARSE) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// Communicators freed so far: a thread's cached lookup (below) is valid while
// this has not moved.
std::atomic<std::uint64_t> g_freed{0};

void copy_str(char* dst, const char* src, std::size_t cap) {
  std::size_t i = 0;
  for (; src && src[i] && i + 1 < cap; ++i) dst[i] = src[i] == '"' || src[i] == '\\' ? '\'' : src[i];
  dst[i] = 0;
}

int delete_info(MPI_Comm, int, void* value, void*) {
  g_freed.fetch_add(1);
  delete static_cast<CommInfo*>(value);
  return MPI_SUCCESS;
}

CommInfo* lookup(Recorder& r, MPI_Comm comm, const std::string& name) {
  void* v = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm, r.keyval, &v, &found);
  if (found) return static_cast<CommInfo*>(v);
  std::lock_guard<std::mutex> lock(r.comm_mu);  // first use of this communicator only
  auto ci = std::make_unique<CommInfo>();
  const int k = r.ncomms.load();
  if (k < kMaxComms) {
    CommDesc& d = r.comms[k];
    copy_str(d.name, name.c_str(), kNameChars);
    MPI_Comm_size(comm, &d.size);
    d.members = std::min(d.size, kMaxMembers);
    int ranks[kMaxMembers];
    for (int i = 0; i < d.members; ++i) ranks[i] = i;
    MPI_Group mine, world;
    MPI_Comm_group(comm, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_translate_ranks(mine, d.members, ranks, world, d.world);
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    ci->index = k;
    r.ncomms.store(k + 1, std::memory_order_release);
  }
  MPI_Comm_set_attr(comm, r.keyval, ci.get());
  return ci.release();
}

// MPI_Comm_get_attr takes a lock in Open MPI: each thread remembers its last communicator.
CommInfo* info(Recorder& r, MPI_Comm comm, const std::string& name) {
  struct Last {
    MPI_Comm comm = MPI_COMM_NULL;
    CommInfo* info = nullptr;
    std::uint64_t freed = 0;
  };
  // initial-exec: a plain offset from the thread pointer, not a __tls_get_addr
  // call per operation (10% of the recorder's cost); ringtrain_comm is loaded at start-up.
  static thread_local Last last __attribute__((tls_model("initial-exec")));
  const std::uint64_t freed = g_freed.load(std::memory_order_acquire);
  if (comm != last.comm || freed != last.freed) last = {comm, lookup(r, comm, name), freed};
  return last.info;
}

// Buffered writes to a file descriptor, async-signal-safe.
struct Out {
  int fd;
  char buf[4096];
  std::size_t n = 0;
  explicit Out(int f) : fd(f) {}
  void flush() {
    std::size_t off = 0;
    while (off < n) {
      ssize_t w = ::write(fd, buf + off, n - off);
      if (w <= 0) break;
      off += static_cast<std::size_t>(w);
    }
    n = 0;
  }
  Out& s(const char* p) {
    for (; *p; ++p) {
      if (n == sizeof buf) flush();
      buf[n++] = *p;
    }
    return *this;
  }
  Out& i(std::int64_t v) {
    char t[24];
    int k = 0;
    const bool neg = v < 0;
    std::uint64_t u = neg ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
    do t[k++] = static_cast<char>('0' + u % 10);
    while ((u /= 10) != 0);
    if (neg) t[k++] = '-';
    char o[25];
    for (int j = 0; j < k; ++j) o[j] = t[k - 1 - j];
    o[k] = 0;
    return s(o);
  }
};

void write_dump(Recorder& r, const char* reason) {
  ::mkdir(r.dir_path, 0755);  // its parent exists (the checkpoint directory, a test's temporary one)
  const int fd = ::open(r.tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  Out o(fd);
  const std::uint64_t next = r.next.load(std::memory_order_acquire);
  o.s("{\"world_rank\":").i(r.world_rank).s(",\"world_size\":").i(r.world_size).s(",\"reason\":\"").s(reason);
  o.s("\",\"time_ns\":").i(now_ns(CLOCK_REALTIME)).s(",\"capacity\":").i(static_cast<std::int64_t>(r.n));
  o.s(",\"recorded\":").i(static_cast<std::int64_t>(next)).s("}\n");
  const int nc = r.ncomms.load(std::memory_order_acquire);
  for (int c = 0; c < nc; ++c) {
    const CommDesc& d = r.comms[c];
    o.s("{\"comm\":").i(c).s(",\"name\":\"").s(d.name).s("\",\"size\":").i(d.size).s(",\"members\":[");
    for (int m = 0; m < d.members; ++m) (m ? o.s(",") : o).i(d.world[m]);
    o.s("]}\n");
  }
  for (std::uint64_t k = next > r.n ? next - r.n : 0; k < next; ++k) {
    const Slot& s = r.slots[k % r.n];
    if (s.id.load(std::memory_order_acquire) != k + 1) continue;  // being rewritten
    char op[kOpChars];
    std::memcpy(op, s.op, sizeof op);
    op[kOpChars - 1] = 0;
    const std::uint8_t st = s.state.load(std::memory_order_acquire);
    const std::int64_t end = s.end_ns.load(std::memory_order_relaxed);
    o.s("{\"seq\":").i(static_cast<std::int64_t>(s.seq)).s(",\"comm\":").i(s.comm).s(",\"op\":\"").s(op);
    o.s("\",\"bytes\":").i(s.bytes).s(",\"peer\":").i(s.peer).s(",\"start_ns\":").i(s.start_ns);
    o.s(",\"end_ns\":").i(st == kStarted ? 0 : end).s(",\"state\":\"");
    o.s(st == kDone ? "done" : st == kFailed ? "failed" : "started").s("\"}\n");
  }
  o.flush();
  ::close(fd);
  ::rename(r.tmp, r.path);
  g_dumped = 1;
}

// `kept` (a stall's diagnosis) first, then "; later: " and `why`; async-signal-safe.
void with_kept(char* out, std::size_t cap, const char* kept, const char* why) {
  std::size_t n = 0;
  auto put = [&](const char* s) {
    for (; s && *s && n + 1 < cap; ++s) out[n++] = *s;
  };
  if (kept[0]) {
    put(kept);
    put("; later: ");
  }
  put(why);
  out[n] = 0;
}

extern "C" void on_fatal(int signo) {
  Recorder* r = g_rec.load();
  // A stall's dump followed by MPI_Abort's abort(): keep the stall's reason.
  if (r && r->path[0] && !g_in_handler && !(signo == SIGABRT && g_dumped)) {
    g_in_handler = 1;
    char sig[32] = "fatal signal ";
    const char* digits = "0123456789";
    std::size_t n = std::strlen(sig);
    if (signo >= 10) sig[n++] = digits[(signo / 10) % 10];
    sig[n++] = digits[signo % 10];
    sig[n] = 0;
    char reason[sizeof r->kept + 64];
    with_kept(reason, sizeof reason, r->kept, sig);
    write_dump(*r, reason);
  }
  for (std::size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i)
    if (kSignals[i] == signo) sigaction(signo, &g_old[i], nullptr);
  raise(signo);
}

}  // namespace

void configure(const std::string& dir, std::size_t entries) {
  if (entries == 0 || g_rec.load()) return;
  auto r = std::make_unique<Recorder>();
  r->n = std::bit_ceil(entries);
  r->slots.reset(new Slot[entries]);
  MPI_Comm_rank(MPI_COMM_WORLD, &r->world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &r->world_size);
  MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_info, &r->keyval, nullptr);
  r->dir = dir;
  if (!dir.empty()) {
    // The directory is made when a record is first written (a run that ends
    // well leaves none behind). No error here: a warning, and no record.
    const std::string p = cat(dir, "/rank", r->world_rank, ".jsonl"), t = p + ".tmp";
    std::error_code ec;
    if (t.size() >= sizeof r->tmp) {
      log::warn("flight recorder: directory path too long: '", dir, "': no flight record will be written");
    } else {
      std::memcpy(r->dir_path, dir.c_str(), dir.size() + 1);
      std::memcpy(r->path, p.c_str(), p.size() + 1);
      std::memcpy(r->tmp, t.c_str(), t.size() + 1);
      // Stale records of an earlier run would be read as this one's.
      std::filesystem::remove(p, ec);
    }
  }
  g_rec.store(r.release());
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fatal;
  sigemptyset(&sa.sa_mask);
  for (std::size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i) sigaction(kSignals[i], &sa, &g_old[i]);
}

bool enabled() { return g_rec.load(std::memory_order_relaxed) != nullptr; }

void suspend(bool suspended) {
  // Recording tests g_rec; the recorder itself stays reachable for dumps through g_kept.
  static std::atomic<Recorder*> g_kept{nullptr};
  if (suspended) {
    if (Recorder* r = g_rec.exchange(nullptr)) g_kept.store(r);
  } else if (Recorder* r = g_kept.exchange(nullptr)) {
    g_rec.store(r);
  }
}

const std::string& dir() {
  Recorder* r = g_rec.load();
  return r ? r->dir : g_no_dir;
}

Op::Op(MPI_Comm comm, const std::string& comm_name, const char* op, std::size_t bytes, int peer) {
  if (trace::on()) {
    trace_name_ = peer < 0 ? cat(op, " ", comm_name) : cat(op, " ", comm_name, " peer ", peer);
    trace_bytes_ = bytes;
    trace_t0_ = std::chrono::steady_clock::now();
  }
  Recorder* r = g_rec.load(std::memory_order_relaxed);
  if (!r) return;
  exceptions_ = std::uncaught_exceptions();
  CommInfo* ci = info(*r, comm, comm_name);
  const std::uint64_t k = r->next.fetch_add(1, std::memory_order_relaxed);
  Slot& s = r->slots[k & (r->n - 1)];
  s.id.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  // Collectives on one communicator never run concurrently (collectives.hpp), so
  // its count needs no atomic increment (a lock prefix, ~10 ns).
  if (peer < 0) {
    s.seq = ci->seq.load(std::memory_order_relaxed) + 1;
    ci->seq.store(s.seq, std::memory_order_relaxed);
  } else {
    s.seq = 0;
  }
  s.bytes = static_cast<std::int64_t>(bytes);
  s.start_ns = now_ns();
  s.end_ns.store(0, std::memory_order_relaxed);
  s.peer = peer;
  s.comm = ci->index;
  s.state.store(kStarted, std::memory_order_relaxed);
  copy_str(s.op, op, kOpChars);
  s.id.store(k + 1, std::memory_order_release);
  slot_ = &s;
  id_ = k + 1;
}

void Op::done() {
  if (!trace_name_.empty()) {
    trace::span("comm", std::move(trace_name_), trace_t0_, std::chrono::steady_clock::now(),
                cat("\"bytes\": ", trace_bytes_));
    trace_name_.clear();
  }
  if (!slot_) return;
  Slot& s = *static_cast<Slot*>(slot_);
  const bool failed = std::uncaught_exceptions() > exceptions_;
  if (s.id.load(std::memory_order_acquire) == id_) {  // not yet overwritten by a newer operation
    s.end_ns.store(now_ns(), std::memory_order_relaxed);
    s.state.store(failed ? kFailed : kDone, std::memory_order_release);
  }
  slot_ = nullptr;
}

Op::~Op() { done(); }

void dump(const std::string& reason, bool diagnosis) {
  Recorder* r = g_rec.load();
  if (!r || !r->path[0]) return;
  // A diagnosis waits for a concurrent dump (it must land); other reasons skip while one is written.
  std::unique_lock<std::mutex> lock(r->dump_mu, std::defer_lock);
  if (diagnosis) lock.lock();
  else if (!lock.try_lock()) return;
  char why[256];
  copy_str(why, reason.c_str(), sizeof why);
  char full[sizeof r->kept + sizeof why + 16];
  with_kept(full, sizeof full, diagnosis ? "" : r->kept, why);
  write_dump(*r, full);
  if (diagnosis && !r->kept[0]) copy_str(r->kept, why, sizeof r->kept);
}

}  // namespace ringtrain::flight_recorder
