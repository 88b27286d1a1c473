#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain {
namespace {

static_assert(sizeof(MPI_Request) <= sizeof(std::uint64_t), "MPI_Request must fit a Request handle");

std::uint64_t pack(MPI_Request r) {
  std::uint64_t h = 0;
  std::memcpy(&h, &r, sizeof r);
  return h;
}
MPI_Request unpack(std::uint64_t h) {
  MPI_Request r;
  std::memcpy(&r, &h, sizeof r);
  return r;
}

// Polls before the first clock read / yield: a small message usually lands
// within a few microseconds, and yielding earlier would add scheduler latency.
constexpr unsigned kSpinPolls = 2000;

}  // namespace

double collective_timeout_from_env() {
  const char* v = std::getenv("RINGTRAIN_COLLECTIVE_TIMEOUT");
  if (!v || !*v) return 300.0;
  char* end = nullptr;
  double s = std::strtod(v, &end);
  RT_CHECK(end && *end == '\0' && s >= 0, "RINGTRAIN_COLLECTIVE_TIMEOUT must be a number of seconds >= 0, got '",
           v, "'");
  return s;
}

MpiTransport::MpiTransport(MPI_Comm comm, int tag, const char* what, std::string comm_name, double timeout_s)
    : comm_(comm), tag_(tag), what_(what), comm_name_(std::move(comm_name)), timeout_s_(timeout_s) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Request MpiTransport::isend(const void* buf, std::size_t bytes, int peer) {
  RT_CHECK(bytes <= static_cast<std::size_t>(INT32_MAX), what_, ": message of ", bytes, " bytes exceeds MPI's int count");
  MPI_Request req;
  int rc = MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag_, comm_, &req);
  RT_CHECK(rc == MPI_SUCCESS, what_, ": MPI_Isend of ", bytes, " bytes to rank ", peer, " on '", comm_name_,
           "' failed (MPI error ", rc, ")");
  return Request{pack(req), peer, true, true};
}

Request MpiTransport::irecv(void* buf, std::size_t bytes, int peer) {
  RT_CHECK(bytes <= static_cast<std::size_t>(INT32_MAX), what_, ": message of ", bytes, " bytes exceeds MPI's int count");
  MPI_Request req;
  int rc = MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag_, comm_, &req);
  RT_CHECK(rc == MPI_SUCCESS, what_, ": MPI_Irecv of ", bytes, " bytes from rank ", peer, " on '", comm_name_,
           "' failed (MPI error ", rc, ")");
  return Request{pack(req), peer, false, true};
}

bool MpiTransport::test(Request& r) {
  if (!r.active) return true;
  MPI_Request req = unpack(r.handle);
  int flag = 0;
  int rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
  // A truncated receive (the ranks disagree on a message's size) fails here.
  RT_CHECK(rc == MPI_SUCCESS, what_, ": MPI_Test (", r.is_send ? "send to" : "receive from", " rank ", r.peer,
           " on '", comm_name_, "') failed (MPI error ", rc, "; do all ranks pass the same count and dtype?)");
  r.handle = pack(req);
  if (!flag) return false;
  r.active = false;
  return true;
}

void MpiTransport::wait(Request& r) {
  if (!r.active) return;
  for (unsigned i = 0; i < kSpinPolls; ++i)
    if (test(r)) return;
  auto start = std::chrono::steady_clock::now();
  for (unsigned i = 1;; ++i) {
    if (test(r)) return;
    std::this_thread::yield();
    if (timeout_s_ > 0 && i % 256 == 0) {
      double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s_) stalled(r, waited);
    }
  }
}

void MpiTransport::stalled(const Request& r, double waited_s) const {
  log::error(what_, ": stalled for ", static_cast<long long>(waited_s), " s waiting to ",
             r.is_send ? "send to" : "receive from", " rank ", r.peer, " of communicator '", comm_name_,
             "' (rank ", rank_, " of ", size_, "); a rank is missing from the collective or passed a different ",
             "count. Aborting the job (RINGTRAIN_COLLECTIVE_TIMEOUT=", timeout_s_, " s)");
  MPI_Abort(comm_, 70);
  std::abort();
}

// ---- workspace ---------------------------------------------------------------

void HostWorkspace::Free::operator()(void* p) const { ::operator delete(p, std::align_val_t{64}); }

void* HostWorkspace::get(std::size_t bytes) {
  if (bytes > bytes_) {
    buf_.reset();
    buf_.reset(::operator new(bytes, std::align_val_t{64}));
    bytes_ = bytes;
  }
  return buf_.get();
}

namespace {

int delete_workspace(MPI_Comm, int, void* value, void*) {
  delete static_cast<HostWorkspace*>(value);
  return MPI_SUCCESS;
}

// The keyval is created once and never changes: the per-communicator state
// itself lives on the communicator.
int workspace_keyval() {
  static const int key = [] {
    int k = MPI_KEYVAL_INVALID;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_workspace, &k, nullptr);
    return k;
  }();
  return key;
}

}  // namespace

HostWorkspace& host_workspace(MPI_Comm comm) {
  int key = workspace_keyval();
  void* v = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm, key, &v, &found);
  if (found) return *static_cast<HostWorkspace*>(v);
  auto* ws = new HostWorkspace();
  MPI_Comm_set_attr(comm, key, ws);
  return *ws;
}

}  // namespace ringtrain
