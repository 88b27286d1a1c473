// All-to-all (comm/alltoall.hpp): local checks, optional cross-rank agreement
// on the counts, then the pairwise exchange over MPI point-to-point (or MPI's
// own MPI_Ialltoallv for algorithm `mpi`), every wait through wait_bounded.
#include "ringtrain/comm/alltoall.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/flight_recorder.hpp"
#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/comm/stall_diagnosis.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain {
namespace {

static_assert(sizeof(std::size_t) == 8, "counts travel as 64-bit integers");

// One call's facts; the first local argument error, "" if none.
struct A2a {
  const char* what;
  const Communicator& comm;
  MPI_Comm h;
  int rank, size;
  std::size_t es;
  std::string error;

  A2a(const char* w, const Communicator& c, DType dtype, const CollectiveOptions& opt)
      : what(w), comm(c), h(c.handle(w)), rank(c.rank()), size(c.size()), es(dtype_size(dtype)) {
    RT_CHECK(opt.device.is_cpu(), what, ": buffers on ", opt.device.str(), " are not supported (host memory only)");
  }
  // The message is built only when `bad` (cat per peer per call cost microseconds).
  template <typename... Args>
  void fail_if(bool bad, const Args&... msg) {
    if (bad && error.empty()) error = cat(what, ": ", msg...);
  }
};

// Local checks of one side's counts/displs against its buffer.
void check_side(A2a& c, const char* side, const void* buf, const std::vector<std::size_t>& counts,
                const std::vector<std::size_t>& displs) {
  c.fail_if(static_cast<int>(counts.size()) != c.size || static_cast<int>(displs.size()) != c.size, side,
            "_counts and ", side, "_displs need ", c.size, " entries (one per rank of communicator '", c.comm.name(),
            "'), got ", counts.size(), " and ", displs.size());
  if (!c.error.empty()) return;
  for (int j = 0; j < c.size; ++j) {
    c.fail_if(buf == nullptr && counts[j] > 0, side, " buffer is null with ", side, "_counts[", j, "] = ", counts[j]);
    c.fail_if(counts[j] * c.es > static_cast<std::size_t>(INT_MAX), side, "_counts[", j, "] = ", counts[j],
              " elements (", counts[j] * c.es, " bytes) exceeds MPI's int count of bytes per message");
  }
}

// [lo, hi) byte ranges of the blocks; true when any send block overlaps any receive block.
bool overlaps(const A2a& c, const void* send, const std::vector<std::size_t>& sc, const std::vector<std::size_t>& sd,
              const void* recv, const std::vector<std::size_t>& rc, const std::vector<std::size_t>& rd) {
  auto span = [&](const void* b, const std::vector<std::size_t>& n, const std::vector<std::size_t>& d) {
    std::pair<const char*, const char*> s{nullptr, nullptr};
    for (int j = 0; j < c.size; ++j) {
      if (n[j] == 0) continue;
      const char* lo = static_cast<const char*>(b) + d[j] * c.es;
      const char* hi = lo + n[j] * c.es;
      s.first = s.first ? std::min(s.first, lo) : lo;
      s.second = std::max(s.second, hi);
    }
    return s;
  };
  auto a = span(send, sc, sd), b = span(recv, rc, rd);
  return a.first && b.first && a.first < b.second && b.first < a.second;
}

// validate: every rank learns what every peer will send it, and the ranks agree
// on dtype and algorithm; a problem on any rank raises an Error on every rank.
void agree(A2a& c, const std::vector<std::size_t>& send_counts, const std::vector<std::size_t>& recv_counts,
           DType dtype, Algorithm algo) {
  const WaitOn on(c.comm, c.what);
  const bool sized = static_cast<int>(send_counts.size()) == c.size && static_cast<int>(recv_counts.size()) == c.size;
  std::vector<std::size_t> out(sized ? send_counts : std::vector<std::size_t>(c.size, 0)), in(c.size);
  MPI_Request req;
  check_mpi(MPI_Ialltoall(out.data(), 1, MPI_UINT64_T, in.data(), 1, MPI_UINT64_T, c.h, &req), c.what, "MPI_Ialltoall");
  wait_bounded(&req, 1, on, c.what);
  for (int i = 0; sized && i < c.size; ++i)
    if (in[i] != recv_counts[i])
      c.fail_if(true, c.comm.describe_rank(i), " sends ", in[i], " elements to rank ", c.rank, ", but recv_counts[", i,
                "] = ", recv_counts[i], " here: the ranks' counts disagree");
  long long v[5] = {static_cast<long long>(dtype), -static_cast<long long>(dtype), static_cast<long long>(algo),
                    -static_cast<long long>(algo), c.error.empty() ? c.size : c.rank};
  bounded::allreduce(v, 5, MPI_LONG_LONG, MPI_MIN, on, c.what);
  if (!c.error.empty()) throw Error(c.error);
  RT_CHECK(v[4] >= c.size, c.what, ": ", c.comm.describe_rank(static_cast<int>(v[4])),
           " found its arguments invalid (its error says which)");
  RT_CHECK(v[0] == -v[1], c.what, ": dtype differs between ranks of communicator '", c.comm.name(),
           "' (this rank: ", dtype_name(dtype), ")");
  RT_CHECK(v[2] == -v[3], c.what, ": algorithm differs between ranks of communicator '", c.comm.name(),
           "' (this rank: ", algorithm_name(algo), ")");
}

[[noreturn]] void stalled(const A2a& c, const StallError& e, int peer, bool is_send, double timeout_s) {
  // The peer we wait for may itself wait for another rank: e names who never came.
  if (c.rank == e.first_live)
    log::error(c.what, ": stalled for ", static_cast<long long>(e.waited_s), " s on communicator '", c.comm.name(),
               "': ", e.diagnosis, "; rank ", c.rank, " of ", c.size, " was waiting to ",
               is_send ? "send to " : "receive from ", c.comm.describe_rank(peer),
               ". Aborting the job (comm.collective_timeout_s = ", timeout_s, " s)");
  else
    std::this_thread::sleep_for(std::chrono::seconds(1));  // let the reporting rank's message out first
  MPI_Abort(c.h, 1);
  std::abort();
}

// Waits for the receive of `expect` elements from rank f; a wrong length is
// remembered in `mismatch` (the first one), a stall ends the job naming f.
void finish_recv(const A2a& c, MPI_Request& rq, int f, std::size_t expect, const WaitOn& on, std::string& mismatch) {
  MPI_Status st;
  try {
    wait_bounded(&rq, 1, on, c.what, OnStall::throw_error, &st);
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (static_cast<std::size_t>(got) != expect * c.es && mismatch.empty())
      mismatch = cat(c.what, ": ", c.comm.describe_rank(f), " sent ", got / static_cast<int>(c.es),
                     " elements to rank ", c.rank, ", but recv_counts[", f, "] = ", expect,
                     " here: the ranks' counts disagree");
  } catch (const StallError& e) {
    stalled(c, e, f, false, on.timeout_s);
  } catch (const Error&) {
    // MPI refused the receive: the block is longer than this rank's buffer for it.
    rq = MPI_REQUEST_NULL;
    if (mismatch.empty())
      mismatch = cat(c.what, ": ", c.comm.describe_rank(f), " sent more than recv_counts[", f, "] = ", expect,
                     " elements to rank ", c.rank, ": the ranks' counts disagree");
  }
}

void finish_send(const A2a& c, MPI_Request& sq, int t, const WaitOn& on) {
  try {
    wait_bounded(&sq, 1, on, c.what, OnStall::throw_error);
  } catch (const StallError& e) {
    stalled(c, e, t, true, on.timeout_s);
  }
}

// The self block: copied, or a mismatch of this rank's own two counts.
std::string copy_own(const A2a& c, const char* send, const std::vector<std::size_t>& sc,
                     const std::vector<std::size_t>& sd, char* recv, const std::vector<std::size_t>& rc,
                     const std::vector<std::size_t>& rd) {
  const int r = c.rank;
  if (rc[r] != sc[r])
    return cat(c.what, ": rank ", r, " sends itself ", sc[r], " elements (send_counts[", r, "]) but expects ", rc[r],
               " (recv_counts[", r, "])");
  if (sc[r]) std::memcpy(recv + rd[r] * c.es, send + sd[r] * c.es, sc[r] * c.es);
  return "";
}

// The pairwise exchange (see the header). Receives are waited for one at a
// time so that a wrong length names its sender; a mismatch is remembered and
// raised once every transfer has completed.
void pairwise(const A2a& c, const char* send, const std::vector<std::size_t>& sc, const std::vector<std::size_t>& sd,
              char* recv, const std::vector<std::size_t>& rc, const std::vector<std::size_t>& rd) {
  const int p = c.size, r = c.rank;
  const std::size_t es = c.es;
  std::string mismatch = copy_own(c, send, sc, sd, recv, rc, rd);
  if (p == 1 && !mismatch.empty()) throw Error(mismatch);
  if (p == 1) return;
  WaitOn on(c.comm, c.what);
  on.spin_s = host_context(c.h, c.comm.local_size()).spin_s;
  const int w = std::min(kAlltoallWindow, p - 1);
  std::vector<MPI_Request> rq(static_cast<std::size_t>(w), MPI_REQUEST_NULL), sq(rq);
  auto from = [&](int k) { return ((r - k) % p + p) % p; };
  auto to = [&](int k) { return (r + k) % p; };
  auto post = [&](int k) {
    const int f = from(k), t = to(k), slot = k % w;
    check_mpi(MPI_Irecv(recv + rd[f] * es, static_cast<int>(rc[f] * es), MPI_BYTE, f, kTagAlltoall, c.h, &rq[slot]),
              c.what, "MPI_Irecv");
    check_mpi(MPI_Isend(send + sd[t] * es, static_cast<int>(sc[t] * es), MPI_BYTE, t, kTagAlltoall, c.h, &sq[slot]),
              c.what, "MPI_Isend");
  };
  for (int k = 1; k <= w; ++k) post(k);
  for (int k = 1; k < p; ++k) {
    const int slot = k % w;
    finish_recv(c, rq[slot], from(k), rc[from(k)], on, mismatch);
    finish_send(c, sq[slot], to(k), on);
    if (k + w < p) post(k + w);
  }
  if (!mismatch.empty()) throw Error(mismatch);
}

// MPI_Ialltoallv posted; `keep` holds the int counts and displacements, which
// must outlive the request.
MPI_Request mpi_post(const A2a& c, const void* send, const std::vector<std::size_t>& sc,
                     const std::vector<std::size_t>& sd, void* recv, const std::vector<std::size_t>& rc,
                     const std::vector<std::size_t>& rd, std::vector<int> (&keep)[4]) {
  auto ints = [&](const std::vector<std::size_t>& v, const char* name) {
    std::vector<int> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      RT_CHECK(v[i] <= static_cast<std::size_t>(INT_MAX), c.what, " (algorithm mpi): ", name, "[", i, "] = ", v[i],
               " exceeds MPI's int");
      out[i] = static_cast<int>(v[i]);
    }
    return out;
  };
  auto &a = keep[0], &b = keep[1], &x = keep[2], &y = keep[3];
  a = ints(sc, "send_counts"), b = ints(sd, "send_displs"), x = ints(rc, "recv_counts"), y = ints(rd, "recv_displs");
  // Counts and displacements in elements of a contiguous type of the element size.
  MPI_Datatype t;
  MPI_Type_contiguous(static_cast<int>(c.es), MPI_BYTE, &t);
  MPI_Type_commit(&t);
  MPI_Request req;
  int rc_ = MPI_Ialltoallv(send, a.data(), b.data(), t, recv, x.data(), y.data(), t, c.h, &req);
  MPI_Type_free(&t);  // MPI keeps it alive until the request completes
  check_mpi(rc_, c.what, "MPI_Ialltoallv");
  return req;
}

void mpi_alltoallv(const A2a& c, const void* send, const std::vector<std::size_t>& sc,
                   const std::vector<std::size_t>& sd, void* recv, const std::vector<std::size_t>& rc,
                   const std::vector<std::size_t>& rd) {
  std::vector<int> keep[4];
  MPI_Request req = mpi_post(c, send, sc, sd, recv, rc, rd, keep);
  wait_bounded(&req, 1, WaitOn(c.comm, c.what), c.what);
}

// The argument checks of both forms (and the agreement when validating).
void check_args(A2a& c, const void* send, const std::vector<std::size_t>& send_counts,
                const std::vector<std::size_t>& send_displs, const void* recv,
                const std::vector<std::size_t>& recv_counts, const std::vector<std::size_t>& recv_displs, DType dtype,
                const CollectiveOptions& opt) {
  c.fail_if(static_cast<unsigned>(dtype) > static_cast<unsigned>(DType::u8), "invalid dtype value ",
            static_cast<int>(dtype));
  check_side(c, "send", send, send_counts, send_displs);
  check_side(c, "recv", recv, recv_counts, recv_displs);
  if (c.error.empty())
    c.fail_if(overlaps(c, send, send_counts, send_displs, recv, recv_counts, recv_displs),
              "send and recv blocks overlap (no in-place form: use separate buffers)");
  if (opt.validate)
    agree(c, send_counts, recv_counts, dtype, opt.algorithm);
  else if (!c.error.empty())
    throw Error(c.error);
}

std::size_t sent_bytes(const A2a& c, const std::vector<std::size_t>& send_counts) {
  return send_counts.size() == static_cast<std::size_t>(c.size)
             ? std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0}) * c.es
             : 0;
}

}  // namespace

std::vector<std::size_t> packed_displs(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> d(counts.size(), 0);
  if (!counts.empty()) std::partial_sum(counts.begin(), counts.end() - 1, d.begin() + 1);
  return d;
}

void alltoallv(const void* send, const std::vector<std::size_t>& send_counts,
               const std::vector<std::size_t>& send_displs, void* recv, const std::vector<std::size_t>& recv_counts,
               const std::vector<std::size_t>& recv_displs, DType dtype, const Communicator& comm,
               const CollectiveOptions& opt) {
  A2a c("alltoallv", comm, dtype, opt);
  // The bytes this rank sends (what a peer that disagrees differs in).
  flight_recorder::Op rec(c.h, comm.name(), c.what, sent_bytes(c, send_counts));
  check_args(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype, opt);
  if (opt.algorithm == Algorithm::mpi && c.size > 1)
    return mpi_alltoallv(c, send, send_counts, send_displs, recv, recv_counts, recv_displs);
  pairwise(c, static_cast<const char*>(send), send_counts, send_displs, static_cast<char*>(recv), recv_counts,
           recv_displs);
}

// The started form: what wait() needs once the caller's arguments are gone.
struct AlltoallvRequest::State {
  Communicator comm;
  DType dtype = DType::u8;
  std::vector<std::size_t> rc;
  std::vector<int> from, to;          // the peer of each receive / send
  std::vector<MPI_Request> rq, sq;
  MPI_Request coll = MPI_REQUEST_NULL;  // algorithm mpi
  std::vector<int> keep[4];
  std::string mismatch;
  bool received = false;
  std::unique_ptr<flight_recorder::Op> rec;
  // The bounded waits of one call (built per call: the handle may be closed meanwhile).
  void wait_receives(const A2a& c, const WaitOn& on) {
    if (received) return;
    received = true;
    if (coll != MPI_REQUEST_NULL) wait_bounded(&coll, 1, on, c.what);
    for (std::size_t i = 0; i < rq.size(); ++i) finish_recv(c, rq[i], from[i], rc[from[i]], on, mismatch);
  }
};

AlltoallvRequest::AlltoallvRequest() = default;
AlltoallvRequest::AlltoallvRequest(AlltoallvRequest&&) noexcept = default;
AlltoallvRequest& AlltoallvRequest::operator=(AlltoallvRequest&& o) noexcept {
  if (this != &o) {
    if (st_) {
      try {
        wait();
      } catch (const std::exception& e) {
        log::error("alltoallv_start: ", e.what());
      }
    }
    st_ = std::move(o.st_);
  }
  return *this;
}

AlltoallvRequest::~AlltoallvRequest() {
  if (!st_) return;
  try {
    wait();
  } catch (const std::exception& e) {
    log::error("alltoallv_start (completed by its destructor): ", e.what());
  }
}

void AlltoallvRequest::progress() {
  if (!st_) return;
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, st_->comm.handle("alltoallv_start"), &flag, MPI_STATUS_IGNORE);
}

double AlltoallvRequest::wait_received() {
  if (!st_ || st_->received) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  A2a c("alltoallv_start", st_->comm, st_->dtype, {});
  WaitOn on(st_->comm, c.what);
  on.spin_s = host_context(c.h, st_->comm.local_size()).spin_s;
  st_->wait_receives(c, on);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double AlltoallvRequest::wait() {
  if (!st_) return 0;
  std::unique_ptr<State> st = std::move(st_);
  const auto t0 = std::chrono::steady_clock::now();
  A2a c("alltoallv_start", st->comm, st->dtype, {});
  WaitOn on(st->comm, c.what);
  on.spin_s = host_context(c.h, st->comm.local_size()).spin_s;
  st->wait_receives(c, on);
  for (std::size_t i = 0; i < st->sq.size(); ++i) finish_send(c, st->sq[i], st->to[i], on);
  st->rec->done();
  if (!st->mismatch.empty()) throw Error(st->mismatch);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

AlltoallvRequest alltoallv_start(const void* send, const std::vector<std::size_t>& send_counts,
                                 const std::vector<std::size_t>& send_displs, void* recv,
                                 const std::vector<std::size_t>& recv_counts,
                                 const std::vector<std::size_t>& recv_displs, DType dtype, const Communicator& comm,
                                 const CollectiveOptions& opt) {
  A2a c("alltoallv_start", comm, dtype, opt);
  auto st = std::make_unique<AlltoallvRequest::State>();
  st->rec = std::make_unique<flight_recorder::Op>(c.h, comm.name(), c.what, sent_bytes(c, send_counts));
  check_args(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype, opt);
  st->comm = comm;
  st->dtype = dtype;
  st->rc = recv_counts;
  AlltoallvRequest out;
  if (opt.algorithm == Algorithm::mpi && c.size > 1) {
    st->coll = mpi_post(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, st->keep);
    out.st_ = std::move(st);
    return out;
  }
  const char* sp = static_cast<const char*>(send);
  char* rp = static_cast<char*>(recv);
  st->mismatch = copy_own(c, sp, send_counts, send_displs, rp, recv_counts, recv_displs);
  const int p = c.size, r = c.rank;
  st->rq.assign(static_cast<std::size_t>(p - 1), MPI_REQUEST_NULL);
  st->sq = st->rq;
  for (int k = 1; k < p; ++k) {  // the pairwise order: the step-k peers first
    const int f = ((r - k) % p + p) % p, t = (r + k) % p;
    st->from.push_back(f);
    st->to.push_back(t);
    check_mpi(MPI_Irecv(rp + recv_displs[f] * c.es, static_cast<int>(recv_counts[f] * c.es), MPI_BYTE, f,
                        kTagAlltoall, c.h, &st->rq[k - 1]),
              c.what, "MPI_Irecv");
    check_mpi(MPI_Isend(sp + send_displs[t] * c.es, static_cast<int>(send_counts[t] * c.es), MPI_BYTE, t,
                        kTagAlltoall, c.h, &st->sq[k - 1]),
              c.what, "MPI_Isend");
  }
  out.st_ = std::move(st);
  return out;
}

void alltoall(const void* send, void* recv, std::size_t count, DType dtype, const Communicator& comm,
              const CollectiveOptions& opt) {
  const int p = comm.size();
  std::vector<std::size_t> counts(static_cast<std::size_t>(p), count), displs(counts.size());
  for (int j = 0; j < p; ++j) displs[j] = static_cast<std::size_t>(j) * count;
  alltoallv(send, counts, displs, recv, counts, displs, dtype, comm, opt);
}

std::vector<std::size_t> alltoallv_exchanging_counts(const void* send, const std::vector<std::size_t>& send_counts,
                                                     std::vector<unsigned char>& recv, DType dtype,
                                                     const Communicator& comm, const CollectiveOptions& opt) {
  const std::vector<std::size_t> recv_counts = exchange_counts(send_counts, comm, opt);
  const std::vector<std::size_t> rd = packed_displs(recv_counts);
  const std::size_t total = recv_counts.empty() ? 0 : rd.back() + recv_counts.back();
  recv.resize(total * dtype_size(dtype));
  CollectiveOptions o = opt;
  o.validate = false;  // the counts were just exchanged: they agree
  alltoallv(send, send_counts, packed_displs(send_counts), recv.data(), recv_counts, rd, dtype, comm, o);
  return recv_counts;
}

std::vector<std::size_t> exchange_counts(const std::vector<std::size_t>& send_counts, const Communicator& comm,
                                         const CollectiveOptions& opt) {
  RT_CHECK(static_cast<int>(send_counts.size()) == comm.size(), "exchange_counts: send_counts needs ", comm.size(),
           " entries (one per rank of communicator '", comm.name(), "'), got ", send_counts.size());
  std::vector<std::size_t> recv(send_counts.size());
  CollectiveOptions o = opt;
  o.validate = false;  // one count each way cannot disagree
  alltoall(send_counts.data(), recv.data(), 1, DType::i64, comm, o);
  return recv;
}

}  // namespace ringtrain
