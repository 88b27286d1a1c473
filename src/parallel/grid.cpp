#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/parallel/grid.hpp"

#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain {

int ProcessGrid::data_parallel_size(int world_size, GridShape s) {
  const auto n = Mesh::sizes_for(world_size, s.dims);
  return n[dim_index(Dim::data)] * n[dim_index(Dim::expert)];
}

ProcessGrid ProcessGrid::make(const Communicator& world_in, GridShape s, double timeout_s) {
  // Every group is the mesh's; only the pipeline's ends are a split of their own.
  ProcessGrid g;
  g.mesh_ = Mesh::make(world_in, s.dims, timeout_s);
  const Mesh& m = g.mesh_;
  g.tp_size_ = m.size(Dim::tensor);
  g.pp_size_ = m.size(Dim::pipeline);
  g.dp_size_ = m.size({Dim::data, Dim::expert});  // expert parallelism is carved from data (mesh.hpp)
  g.tp_ = m.coord(Dim::tensor);
  g.dp_ = m.coord(Dim::data) * m.size(Dim::expert) + m.coord(Dim::expert);
  g.pp_ = m.coord(Dim::pipeline);
  RT_CHECK(s.chunks >= 1, "process grid: model chunks per pipeline rank must be >= 1, got ", s.chunks);
  g.layout_ = {g.pp_size_, s.chunks, s.placement};
  g.world_ = m.world();
  const Communicator& world = g.world_;
  g.dp_comm_ = m.group({Dim::data, Dim::expert});
  g.pp_comm_ = m.group({Dim::pipeline});
  g.tp_comm_ = m.group({Dim::tensor});
  g.replica_comm_ = m.group({Dim::pipeline, Dim::tensor});
  // ZeRO shards over the ranks whose arenas hold the same parameters: with
  // experts split (parallel.expert > 1) the expert-data ranks (parallel/updater.cpp).
  g.zero_comm_ = m.group(m.size(Dim::expert) > 1 ? kExpertReduce : kDenseReduce).dup("zero");
  g.split_ends();
  // Tensor groups all-reduce on the critical path of every layer pair: across
  // nodes that costs far more. The widest group decides (nodes may be uneven).
  int spans = g.tp_comm_.node_count();
  bounded::allreduce(&spans, 1, MPI_INT, MPI_MAX, WaitOn(world, "grid"),
                     "process grid: the all-reduce of the tensor groups' node counts");
  const std::string w = tensor_span_warning(g.tp_size_, spans);
  if (!w.empty() && world.rank() == 0) log::warn(w);
  return g;
}

// The first and last stage's ranks of each (dp, cp, tp) coordinate; every other rank alone.
void ProcessGrid::split_ends() {
  const int r = world_.rank();
  const bool end = first_stage() != last_stage();
  std::array<int, kMeshDims> first = mesh_.coords();
  first[dim_index(Dim::pipeline)] = 0;
  ends_comm_ = world_.split(end ? mesh_.rank_of(first) : world_.size() + r, pp_, "pp_ends");
}

void ProcessGrid::set_pipeline_layout(const PipelineLayout& L) {
  RT_CHECK(L.ranks == pp_size_ && L.chunks >= 1, "process grid: a pipeline layout of ", L.ranks, " ranks x ", L.chunks,
           " chunks for ", pp_size_, " pipeline ranks");
  layout_ = L;
  split_ends();
}

std::string ProcessGrid::tensor_span_warning(int tensor, int nodes) {
  if (tensor <= 1 || nodes <= 1) return "";
  return cat("parallel.tensor = ", tensor, " spans ", nodes,
             " nodes: its all-reduces leave shared memory (keep a tensor group within a node)");
}

std::string ProcessGrid::tag() const {
  // dp (data x expert) and pp always, then every other dimension of size > 1, outermost first.
  std::string t = cat("[dp ", dp_, " pp ", pp_);
  for (int i = 0; i < kMeshDims; ++i) {
    const Dim d = dim_at(i);
    if (d != Dim::pipeline && d != Dim::data && !kDims[i].carved_from_data && mesh_.size(d) > 1)
      t += cat(" ", kDims[i].short_name, " ", mesh_.coord(d));
  }
  return t + "]";
}

}  // namespace ringtrain
