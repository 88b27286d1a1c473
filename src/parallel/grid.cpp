#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/parallel/grid.hpp"

#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain {

int ProcessGrid::data_parallel_size(int world_size, GridShape s) {
  RT_CHECK(s.tensor >= 1, "configuration key 'parallel.tensor' must be >= 1, got ", s.tensor);
  RT_CHECK(s.pipeline >= 1, "configuration key 'parallel.pipeline' must be >= 1, got ", s.pipeline);
  RT_CHECK(world_size % (s.pipeline * s.tensor) == 0, "parallel.pipeline = ", s.pipeline, " x parallel.tensor = ",
           s.tensor, " does not divide the ", world_size, " ranks of the job");
  return world_size / (s.pipeline * s.tensor);
}

ProcessGrid ProcessGrid::make(const Communicator& world_in, GridShape s, double timeout_s) {
  // Pure arithmetic on values every rank shares: every rank raises the same Error.
  ProcessGrid g;
  g.tp_size_ = s.tensor;
  g.pp_size_ = s.pipeline;
  g.dp_size_ = data_parallel_size(world_in.size(), s);
  const int r = world_in.rank();
  g.tp_ = r % g.tp_size_;
  g.dp_ = (r / g.tp_size_) % g.dp_size_;
  g.pp_ = r / (g.tp_size_ * g.dp_size_);
  g.world_ = world_in.dup("world", timeout_s);
  const Communicator& world = g.world_;
  // Colour = the coordinates that stay fixed in the group, key = the one that varies.
  g.dp_comm_ = world.split(g.tp_ + g.pp_ * g.tp_size_, g.dp_, "dp");
  g.pp_comm_ = world.split(g.tp_ + g.dp_ * g.tp_size_, g.pp_, "pp");
  g.tp_comm_ = world.split(g.dp_ + g.pp_ * g.dp_size_, g.tp_, "tp");
  g.replica_comm_ = world.split(g.dp_, world.rank(), "replica");
  g.zero_comm_ = g.dp_comm_.dup("zero");
  // The first and last stage of each (dp, tp) coordinate; every other stage alone.
  const bool end = g.pp_ == 0 || g.pp_ == g.pp_size_ - 1;
  g.ends_comm_ = world.split(end ? g.tp_ + g.dp_ * g.tp_size_ : g.tp_size_ * g.dp_size_ + r, g.pp_, "pp_ends");
  // Tensor groups all-reduce on the critical path of every layer pair: across
  // nodes that costs far more. The widest group decides (nodes may be uneven).
  int spans = g.tp_comm_.node_count();
  bounded::allreduce(&spans, 1, MPI_INT, MPI_MAX, WaitOn(world, "grid"),
                     "process grid: the all-reduce of the tensor groups' node counts");
  const std::string w = tensor_span_warning(g.tp_size_, spans);
  if (!w.empty() && world.rank() == 0) log::warn(w);
  return g;
}

std::string ProcessGrid::tensor_span_warning(int tensor, int nodes) {
  if (tensor <= 1 || nodes <= 1) return "";
  return cat("parallel.tensor = ", tensor, " spans ", nodes,
             " nodes: its all-reduces leave shared memory (keep a tensor group within a node)");
}

std::string ProcessGrid::tag() const {
  std::string t = cat("[dp ", dp_, " pp ", pp_);
  if (tp_size_ > 1) t += cat(" tp ", tp_);
  return t + "]";
}

}  // namespace ringtrain
