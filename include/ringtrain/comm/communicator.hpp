#pragma once
// Communicator: a handle on an MPI communicator with the facts the collectives
// and the parallel layouts need. It is passed explicitly (no global world).
// Copies share one underlying MPI communicator; close() frees it for all copies,
// after which any use throws an Error naming the operation.
#include <mpi.h>

#include <memory>
#include <string>

namespace ringtrain {

// Starts MPI (MPI_THREAD_MULTIPLE: the fusion engine's thread communicates
// while the main thread may run evaluation collectives) and finalises it.
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

class Communicator {
 public:
  Communicator() = default;
  // Duplicates `comm` so that ringtrain's traffic never matches a user's.
  static Communicator dup_of(MPI_Comm comm, std::string name = "world");
  static Communicator world() { return dup_of(MPI_COMM_WORLD, "world"); }

  bool valid() const { return state_ && !state_->closed; }
  int rank() const;
  int size() const;
  int local_rank() const;  // rank among the ranks on this node (MPI_COMM_TYPE_SHARED)
  int local_size() const;
  // Facts about the whole communicator's layout on nodes (the same on every rank):
  int node_count() const;      // nodes it spans
  int max_local_size() const;  // ranks on its most populated node
  const std::string& name() const;

  // Sub-groups for hybrid parallelism (MPI_Comm_split semantics).
  Communicator split(int color, int key, std::string name) const;
  Communicator dup(std::string name) const;

  // The MPI handle for `what` (the calling operation's name, for the error).
  MPI_Comm handle(const char* what = "communicator use") const;
  void close();
  void barrier() const;

 private:
  struct State {
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0, size = 1, local_rank = 0, local_size = 1, nodes = 1, max_local = 1;
    std::string name;
    bool closed = false;
    ~State();
  };
  std::shared_ptr<State> state_;
};

}  // namespace ringtrain
