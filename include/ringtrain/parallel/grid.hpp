#pragma once
// ProcessGrid: the trainer's view of the mesh (parallel/mesh.hpp): the world
// split into tensor-, data- and pipeline-parallel groups, Megatron's order:
// rank = tp + dp·TP + pp·TP·DP (tensor innermost so it stays inside a node,
// pipeline outermost). Its groups are the mesh's; mesh() answers the rest
// (which group reduces a parameter: mesh().group(info.reduce_over)).
//
// Rules:
//  - make() is collective over `world` and checks the sizes on every rank
//    alike: a world that pipeline·tensor does not divide
//    is an Error naming the values on every rank.
//  - The grid makes every communicator of the job's training, each a fresh
//    split or duplicate (traffic on one never matches another's) with the
//    job's collective timeout passed explicitly: world, the data, pipeline and
//    tensor groups, the replica (a data-parallel rank's stages and shards:
//    global-norm clipping and fp16's finiteness check), ZeRO's group and the
//    pipeline's ends (a tied weight's two copies: parallel/grad_sync.hpp). The
//    fusion engine duplicates dp() and so inherits its timeout. A wait on any
//    of them past the timeout ends the job naming the rank that never came.
//  - A tensor group spanning nodes is a warning (tensor_span_warning), not an error.
//  - tag() names this rank's coordinates for log lines and errors: "[dp 1 pp 3]".
#include <string>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/parallel/mesh.hpp"
#include "ringtrain/parallel/pipeline_layout.hpp"

namespace ringtrain {

struct GridShape {
  MeshShape dims;  // the size of every dimension of the mesh (train: Config::mesh_shape)
  // Model chunks per pipeline rank and where they sit (pipeline_layout.hpp):
  // the schedule's (schedule.hpp layout_for); 1 chunk unless it interleaves.
  int chunks = 1;
  ChunkPlacement placement = ChunkPlacement::loop;
  GridShape() = default;
  GridShape(MeshShape d, int chunks_ = 1, ChunkPlacement p = ChunkPlacement::loop)
      : dims(d), chunks(chunks_), placement(p) {}
  // The positional form of earlier releases (tests, benches).
  GridShape(int pipeline, int tensor = 1, int context = 1, int chunks_ = 1,
            ChunkPlacement p = ChunkPlacement::loop, int expert = 1)
      : dims(pipeline, context, tensor, expert), chunks(chunks_), placement(p) {}
};

class ProcessGrid {
 public:
  // timeout_s: comm.collective_timeout_s (0 = never).
  static ProcessGrid make(const Communicator& world, GridShape shape,
                          double timeout_s = kDefaultCollectiveTimeoutS);
  // The pure arithmetic, checked (no MPI): DP size for `world_size` ranks.
  static int data_parallel_size(int world_size, GridShape shape);
  // The warning make() logs (world rank 0) when a tensor group of `tensor`
  // ranks spans `nodes` > 1 nodes (the most of any group); "" when none.
  static std::string tensor_span_warning(int tensor, int nodes);

  int tp_size() const { return tp_size_; }
  int cp_size() const { return mesh_.size(Dim::context); }
  int cp_rank() const { return mesh_.coord(Dim::context); }
  int dp_size() const { return dp_size_; }
  int pp_size() const { return pp_size_; }
  int tp_rank() const { return tp_; }
  int dp_rank() const { return dp_; }
  int pp_rank() const { return pp_; }
  // Whether this rank holds the model's first (last) chunk: it reads the
  // inputs (applies the loss). Under the V layout rank 0 holds both.
  bool first_stage() const { return layout_.rank_of(0) == pp_; }
  bool last_stage() const { return layout_.rank_of(layout_.stages() - 1) == pp_; }
  const PipelineLayout& pipeline_layout() const { return layout_; }
  // Another layout of the same pipeline ranks (parallel.schedule = auto is
  // resolved once the model is known). Collective over the world: the ends
  // group is split again.
  void set_pipeline_layout(const PipelineLayout& L);
  // World rank of grid coordinates (tp, dp, pp) at context rank 0.
  int world_rank_of(int tp, int dp, int pp) const {
    const int x = mesh_.size(Dim::expert);
    return mesh_.rank_of({pp, dp / x, dp % x, 0, tp});
  }
  // The expert group (parallel.expert; this rank alone when 1).
  const Communicator& ep() const { return mesh_.group({Dim::expert}); }
  int ep_size() const { return mesh_.size(Dim::expert); }

  const Communicator& world() const { return world_; }
  const Communicator& dp() const { return dp_comm_; }  // same pp and tp, ranks ordered by dp (data x expert)
  const Communicator& pp() const { return pp_comm_; }  // same dp and tp, ranks ordered by stage
  const Communicator& tp() const { return tp_comm_; }
  const Communicator& cp() const { return mesh_.group({Dim::context}); }
  const Communicator& replica() const { return replica_comm_; }  // same dp: pp x tp ranks
  // ZeRO's collectives: a duplicate of dp() (with parallel.expert > 1, of the
  // expert-data group: data x context, whose arenas hold the same experts).
  const Communicator& zero() const { return zero_comm_; }
  // The ranks holding the first and the last chunk of this rank's dp and tp
  // coordinates, ranked by stage (2 ranks; this rank alone at pipeline 1, on
  // the stages between, and where one rank holds both: the V layout).
  const Communicator& ends() const { return ends_comm_; }
  double timeout_s() const { return world_.timeout_s(); }
  const Mesh& mesh() const { return mesh_; }
  // The group a parameter's gradient is averaged over (ParamInfo::reduce_over).
  const Communicator& reduce_group(DimSet reduce_over) const { return mesh_.group(reduce_over); }
  std::string tag() const;  // "[dp 1 pp 3]" (tp appears once tensor > 1)

 private:
  void split_ends();
  Mesh mesh_;
  PipelineLayout layout_;
  Communicator world_, dp_comm_, pp_comm_, tp_comm_, replica_comm_, zero_comm_, ends_comm_;
  int tp_size_ = 1, dp_size_ = 1, pp_size_ = 1;
  int tp_ = 0, dp_ = 0, pp_ = 0;
};

}  // namespace ringtrain
