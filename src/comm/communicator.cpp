#include "ringtrain/comm/communicator.hpp"

#include <cstdlib>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/liveness.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain {

std::string thread_level_error(int provided) {
  if (provided >= MPI_THREAD_MULTIPLE) return "";
  const char* name = provided == MPI_THREAD_SINGLE       ? "MPI_THREAD_SINGLE"
                     : provided == MPI_THREAD_FUNNELED   ? "MPI_THREAD_FUNNELED"
                     : provided == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                                                         : "an unknown level";
  return cat("MPI provides thread level ", name, " (", provided, "), but ringtrain needs MPI_THREAD_MULTIPLE (",
             MPI_THREAD_MULTIPLE, "): the fusion engine's thread and the tensor groups' helper threads call MPI ",
             "while the main thread does. Use an MPI library built with thread support (Open MPI: ",
             "--enable-mpi-thread-multiple; MPICH: --enable-threads=multiple), and initialise MPI with ",
             "MPI_Init_thread(MPI_THREAD_MULTIPLE) if your program does so itself");
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) {
    MPI_Query_thread(&provided_);
    // Someone else owns MPI: refuse as below, but leave finalising to them.
    const std::string err = thread_level_error(provided_);
    if (!err.empty()) throw Error(err);
    return;
  }
  // A process that no launcher started (a singleton: export, prepare, generate
  // run directly) talks to itself alone, yet Open MPI 4 would fork a daemon
  // for MPI_Comm_spawn (which ringtrain never calls), 0.1 s, and probe the
  // fabrics' transports (libfabric, PSM) to choose a messaging layer, 0.2 s:
  // together most of such a command's start. A singleton gets no daemon and
  // the plain point-to-point layer (ob1: shared memory and self). Processes
  // that mpirun or srun started (their rank variables set) are left alone, and
  // a user's own values win.
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") ||
                        std::getenv("PMI_RANK") || std::getenv("PMI_SIZE");
  if (!launched) {
    ::setenv("OMPI_MCA_ess_singleton_isolated", "1", /*overwrite=*/0);
    ::setenv("OMPI_MCA_pml", "ob1", /*overwrite=*/0);
  }
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided_);
  owns_ = true;
  // Refuse before anything starts a thread: no code serialises MPI calls, so a
  // lower level would be undefined behaviour, not a slowdown. Every rank says so.
  if (const std::string err = thread_level_error(provided_); !err.empty()) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    log::set_rank(rank, size);
    log::error(err);
    MPI_Finalize();
    std::exit(1);
  }
  // Errors become return codes, so they turn into ringtrain::Error with a message.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  liveness::start();  // a stall names the rank that stopped (comm/liveness.hpp)
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  log::set_rank(rank, size);
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) {
    liveness::stop();
    MPI_Finalize();
  }
}

Communicator::State::~State() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!closed && comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm);
}

Communicator Communicator::dup_of(MPI_Comm comm, std::string name, double timeout_s) {
  RT_CHECK(timeout_s >= 0, "communicator '", name, "': the collective timeout must be >= 0 seconds (0 = never), got ",
           timeout_s);
  Communicator c;
  c.state_ = std::make_shared<State>();
  auto& s = *c.state_;
  // Every collective step here is bounded by the new communicator's timeout
  // (comm/bounded_wait.hpp): a rank that never arrives ends the job, named.
  const std::string what = cat("creating communicator '", name, "'");
  MPI_Request req;
  check_mpi(MPI_Comm_idup(comm, &s.comm, &req), what.c_str(), "MPI_Comm_idup");
  wait_bounded(&req, 1, WaitOn(comm, timeout_s, name), what.c_str());
  const WaitOn on(s.comm, timeout_s, name);
  MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(s.comm, &s.rank);
  MPI_Comm_size(s.comm, &s.size);
  MPI_Comm local;
  MPI_Comm_split_type(s.comm, MPI_COMM_TYPE_SHARED, s.rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &s.local_rank);
  MPI_Comm_size(local, &s.local_size);
  MPI_Comm_free(&local);
  // Node layout for the node-aware algorithms: the same answer on every rank.
  int facts[2] = {s.local_size, s.local_rank == 0 ? 1 : 0};
  bounded::allreduce(&facts[0], 1, MPI_INT, MPI_MAX, on, what.c_str());
  bounded::allreduce(&facts[1], 1, MPI_INT, MPI_SUM, on, what.c_str());
  s.max_local = facts[0];
  s.nodes = facts[1];
  s.name = std::move(name);
  s.timeout_s = timeout_s;
  // World ranks, for messages that name a peer (a local translation, no communication).
  MPI_Group mine, world;
  MPI_Comm_group(s.comm, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(static_cast<std::size_t>(s.size));
  for (int r = 0; r < s.size; ++r) ranks[static_cast<std::size_t>(r)] = r;
  s.world_ranks.assign(ranks.size(), MPI_UNDEFINED);
  MPI_Group_translate_ranks(mine, s.size, ranks.data(), world, s.world_ranks.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  return c;
}

#define RT_STATE_CHECK(what)                                                                \
  RT_CHECK(state_ != nullptr, what, ": the communicator was never initialised");           \
  RT_CHECK(!state_->closed, what, ": communicator '", state_->name, "' is closed")

int Communicator::rank() const { RT_STATE_CHECK("rank()"); return state_->rank; }
int Communicator::size() const { RT_STATE_CHECK("size()"); return state_->size; }
int Communicator::local_rank() const { RT_STATE_CHECK("local_rank()"); return state_->local_rank; }
int Communicator::local_size() const { RT_STATE_CHECK("local_size()"); return state_->local_size; }
int Communicator::node_count() const { RT_STATE_CHECK("node_count()"); return state_->nodes; }
int Communicator::max_local_size() const { RT_STATE_CHECK("max_local_size()"); return state_->max_local; }
const std::string& Communicator::name() const { RT_STATE_CHECK("name()"); return state_->name; }
double Communicator::timeout_s() const { RT_STATE_CHECK("timeout_s()"); return state_->timeout_s; }

int Communicator::world_rank(int rank) const {
  RT_STATE_CHECK("world_rank()");
  RT_CHECK(rank >= 0 && rank < state_->size, "world_rank(", rank, "): communicator '", state_->name, "' has ",
           state_->size, " ranks");
  return state_->world_ranks[static_cast<std::size_t>(rank)];
}

std::string Communicator::describe_rank(int rank) const {
  RT_STATE_CHECK("describe_rank()");
  if (rank < 0 || rank >= state_->size) return cat("rank ", rank, " of '", state_->name, "'");
  return cat("rank ", rank, " of '", state_->name, "' (world rank ", world_rank(rank), ")");
}

MPI_Comm Communicator::handle(const char* what) const {
  RT_STATE_CHECK(what);
  return state_->comm;
}

Communicator Communicator::split(int color, int key, std::string name) const {
  return split(color, key, std::move(name), timeout_s());
}

Communicator Communicator::split(int color, int key, std::string name, double timeout_s) const {
  // MPI_Comm_split has no non-blocking form: a bounded barrier first, so that a
  // rank that never comes ends the job here rather than hanging the split.
  bounded::barrier(WaitOn(*this, "split"), cat("splitting communicator '", state_->name, "' into '", name, "'").c_str());
  MPI_Comm sub;
  RT_CHECK(MPI_Comm_split(handle("split"), color, key, &sub) == MPI_SUCCESS,
           "MPI_Comm_split of '", state_->name, "' failed");
  Communicator c = dup_of(sub, std::move(name), timeout_s);
  MPI_Comm_free(&sub);
  return c;
}

Communicator Communicator::dup(std::string name) const { return dup(std::move(name), timeout_s()); }
Communicator Communicator::dup(std::string name, double timeout_s) const {
  return dup_of(handle("dup"), std::move(name), timeout_s);
}

void Communicator::close() {
  if (!state_ || state_->closed) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&state_->comm);
  state_->closed = true;
}

void Communicator::barrier() const {
  bounded::barrier(WaitOn(*this, "barrier"), cat("barrier on '", state_->name, "'").c_str());
}

}  // namespace ringtrain
