#pragma once
// Communicator: a handle on an MPI communicator with the facts the collectives
// and the parallel layouts need. It is passed explicitly (no global world).
// Copies share one underlying MPI communicator; close() frees it for all copies,
// after which any use throws an Error naming the operation.
// Every communicator carries its collective timeout, fixed when it is made and
// inherited by its splits and duplicates: a wait on it (our collectives, the
// agreement, point-to-point transfers of the pipeline) that lasts longer ends
// the job naming the ranks that never came (0 = wait forever).
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

namespace ringtrain {

// Starts MPI (MPI_THREAD_MULTIPLE: the fusion engine's thread and the tensor
// groups' helper threads communicate while the main thread does) and finalises
// it. A library that provides less is refused: every rank logs
// thread_level_error() and the process exits 1 (an Error when MPI was
// initialised by someone else).
// "" when `provided` (MPI_Init_thread's answer) is MPI_THREAD_MULTIPLE, else the refusal naming both levels.
std::string thread_level_error(int provided);

class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  int thread_level() const { return provided_; }

 private:
  int provided_ = 0;
  bool owns_ = false;
};

inline constexpr double kDefaultCollectiveTimeoutS = 300;

class Communicator {
 public:
  Communicator() = default;
  // Duplicates `comm` so that ringtrain's traffic never matches a user's.
  static Communicator dup_of(MPI_Comm comm, std::string name = "world",
                             double timeout_s = kDefaultCollectiveTimeoutS);
  static Communicator world(double timeout_s = kDefaultCollectiveTimeoutS) {
    return dup_of(MPI_COMM_WORLD, "world", timeout_s);
  }

  bool valid() const { return state_ && !state_->closed; }
  int rank() const;
  int size() const;
  int local_rank() const;  // rank among the ranks on this node (MPI_COMM_TYPE_SHARED)
  int local_size() const;
  // Facts about the whole communicator's layout on nodes (the same on every rank):
  int node_count() const;      // nodes it spans
  int max_local_size() const;  // ranks on its most populated node
  const std::string& name() const;
  double timeout_s() const;        // seconds a wait may last (0 = forever)
  int world_rank(int rank) const;  // MPI_COMM_WORLD's rank of this communicator's `rank`
  // "rank 1 of 'tp' (world rank 5)": how errors name a peer.
  std::string describe_rank(int rank) const;

  // Sub-groups for hybrid parallelism (MPI_Comm_split semantics); both keep
  // this communicator's timeout unless given another.
  Communicator split(int color, int key, std::string name) const;
  Communicator split(int color, int key, std::string name, double timeout_s) const;
  Communicator dup(std::string name) const;
  Communicator dup(std::string name, double timeout_s) const;

  // The MPI handle for `what` (the calling operation's name, for the error).
  MPI_Comm handle(const char* what = "communicator use") const;
  void close();
  void barrier() const;

 private:
  struct State {
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0, size = 1, local_rank = 0, local_size = 1, nodes = 1, max_local = 1;
    double timeout_s = kDefaultCollectiveTimeoutS;
    std::vector<int> world_ranks;  // of each rank
    std::string name;
    bool closed = false;
    ~State();
  };
  std::shared_ptr<State> state_;
};

}  // namespace ringtrain
