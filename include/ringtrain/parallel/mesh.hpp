#pragma once
// Mesh: the job's ranks as a grid of named dimensions, outermost first
//
//   pipeline × data × expert × context × tensor
//   rank = tp + cp·T + ep·T·C + dp·T·C·X + pp·T·C·X·D      (Megatron's order)
//
// Expert parallelism is carved from the data-parallel ranks (as Megatron-Core
// does): the X ranks of an expert group hold different experts but, for the
// dense weights and the data, they are data-parallel replicas like any other.
// So the trainer's data-parallel group is data × expert (its size and rank
// are those of every release before), dense weights reduce over
// data × expert × context, and expert weights over data × context only (the
// ranks holding the same experts). Placing it inside data, next to context and
// tensor, keeps the all-to-all of an expert group on neighbouring ranks.
//
// so that the tensor group, which communicates on every layer, is made of
// neighbouring ranks (one node), and the pipeline, which sends least, spans
// nodes. With context = 1 this is ringtrain's data × pipeline × tensor order
// of every earlier release (rank = tp + dp·T + pp·T·D).
//
// Rules:
//  - make() is collective over `world`; the sizes are checked on every rank
//    alike (pure arithmetic), so a layout the ranks do not fill is the same
//    Error everywhere, naming the configuration keys.
//  - Every group is made once, in make(), with the job's collective timeout:
//    group(S) is the ranks that share this rank's coordinates outside the
//    dimensions S, ranked by their linear index inside S (innermost fastest).
//    group({}) is this rank alone, group(all) the world. Each is a fresh
//    split, so traffic on one never matches another's.
//  - A parameter says over which dimensions it is replicated (ParamInfo::
//    reduce_over: data × context for every parameter today, a different set
//    for expert weights): its gradient is averaged over group(reduce_over),
//    whatever the layout. Gradient synchronisation, ZeRO, the initial
//    broadcast and checkpoints ask the mesh, never a single data group.
//  - Adding a dimension: a Dim value and its row in kDims (nn/mesh_dims.hpp),
//    its key (train/config.cpp: the field and Config::mesh_shape); the mesh,
//    the grid's tag, the GPU gate and the layout checks loop over kDims. Its
//    parallel part takes group({that dim}) (parallel/parts.cpp binds it).
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/nn/mesh_dims.hpp"

namespace ringtrain {

class Mesh {
 public:
  // timeout_s: comm.collective_timeout_s (0 = never).
  static Mesh make(const Communicator& world, MeshShape shape, double timeout_s = kDefaultCollectiveTimeoutS);
  // The pure arithmetic, checked (no MPI): the sizes of every dimension at `world_size` ranks.
  static std::array<int, kMeshDims> sizes_for(int world_size, MeshShape shape);

  int size(Dim d) const { return size_[dim_index(d)]; }
  int coord(Dim d) const { return coord_[dim_index(d)]; }
  int size(DimSet s) const;  // the product over s
  const std::array<int, kMeshDims>& sizes() const { return size_; }
  const std::array<int, kMeshDims>& coords() const { return coord_; }
  // World rank of the given coordinates (outermost first).
  int rank_of(const std::array<int, kMeshDims>& coords) const;
  std::array<int, kMeshDims> coords_of(int world_rank) const;

  const Communicator& world() const { return world_; }
  const Communicator& group(DimSet s) const { return groups_[s.bits()]; }
  // "pipeline 2 × data 2 × tensor 2" (dimensions of size 1 left out; "1 rank").
  std::string describe() const;

 private:
  std::array<int, kMeshDims> size_{}, coord_{};
  Communicator world_;
  std::vector<Communicator> groups_;  // by DimSet bits
};

}  // namespace ringtrain
