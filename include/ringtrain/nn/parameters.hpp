#pragma once
// ParamArena: every parameter and its gradient live in one flat buffer per
// dtype, with per-parameter views, in registration order. That order is the
// model's construction order, identical on every rank, so the fusion engine,
// optimizers, checkpoints and broadcasts can all work on spans of the arena.
//
// Rules: register everything (add) before finalize(); views stay valid for the
// arena's lifetime; each parameter starts on a 64-byte boundary so kernels can
// use aligned vector loads on any view.
#include <cstddef>
#include <string>
#include <vector>

#include "ringtrain/core/tensor.hpp"
#include "ringtrain/nn/mesh_dims.hpp"

namespace ringtrain {

// How a parameter is split over the tensor-parallel group. Replicated
// (dim < 0, the default): every tensor rank holds the whole parameter and
// computes the same gradient. Sharded: this rank holds part `index` of `parts`
// along `dim`; the global extent of `dim` is `blocks` equal blocks, each split
// into `parts` (blocks = 3 for a fused q|k|v projection, so every rank keeps
// its heads of q, k and v). Local row r of block b is global row
// b * global[dim] / blocks + index * local_block + r (see shard_offset()).
struct ShardSpec {
  int dim = -1;
  int parts = 1, index = 0, blocks = 1;
  Shape global;  // the whole parameter's shape (empty when replicated)
  bool sharded() const { return dim >= 0; }
};

// Where a piece of a whole state tensor sits (checkpoints that every rank
// writes in part): elements [begin, begin + n) in row-major order of the
// tensor-parallel part `shard.index` of `shard` (replicated: of the whole
// tensor `whole`). Pieces of every part together cover the whole exactly once.
struct PiecePlace {
  Shape whole;
  ShardSpec shard;
  std::int64_t begin = 0;
};

// One rank's piece of the state (a 1-D view of live memory until snapshotted).
struct StatePiece {
  std::string name;  // "param/fc1.weight", "optim/exp_avg/fc1.weight", ...
  Tensor data;       // 1-D, the piece's elements
  PiecePlace place;
};

struct ParamInfo {
  std::string name;        // "conv1.weight"
  Shape shape;
  DType dtype = DType::f32;
  std::size_t offset = 0;  // in elements, within the flat buffer of its dtype
  bool decay = true;       // weight decay / LARS trust ratio apply (false for biases and norms)
  int layer = -1;          // index of the owning layer in the model
  ShardSpec shard;         // tensor parallelism: replicated unless set_shard() said otherwise
  // The mesh dimensions this parameter is replicated over: its gradient is
  // averaged over the mesh's group of them (parallel/mesh.hpp).
  DimSet reduce_over = kDenseReduce;
  // Pipeline parallelism with a tied weight (a language model's LM head on the
  // last stage, its embedding on the first: nn/language.hpp). copy_of: this is
  // the head's copy of the embedding's parameter of the same name, whose model
  // index it holds (-1: not a copy); copied: this is that owner. Both start
  // from the owner's values and their gradients are summed every step
  // (parallel/grad_sync.hpp), so they stay bitwise equal; checkpoints hold the
  // owner's alone, and the copy is read from the owner's entry.
  std::int64_t copy_of = -1;
  bool copied = false;
};

class ParamArena {
 public:
  // Registers a parameter; returns its index. Only before finalize().
  std::size_t add(std::string name, Shape shape, DType dt = DType::f32, bool decay = true, int layer = -1);
  // Allocates the flat parameter and gradient buffers (zeroed) on `dev`.
  // Host buffers are always in pages a PageLedger can give back; on a device,
  // `chunked` asks for chunked memory (ZeRO-2/3: Tensor::paged), else plain.
  void finalize(Device dev = Device::cpu(), bool chunked = false);
  bool finalized() const { return finalized_; }

  std::size_t size() const { return infos_.size(); }
  const ParamInfo& info(std::size_t i) const { return infos_.at(i); }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  // Marks parameter i as a shard of a larger parameter (before or after finalize);
  // checks that the local shape is the global one divided as `s` says.
  void set_shard(std::size_t i, ShardSpec s);
  // Parameter i is replicated over `dims` instead of kDenseReduce (before finalize).
  void set_reduce_over(std::size_t i, DimSet dims);
  // The distinct reduce_over sets of the parameters, in a fixed order.
  std::vector<DimSet> reduce_sets() const;
  std::size_t index_of(const std::string& name) const;  // throws Error naming it
  // Tied weights across pipeline stages (see ParamInfo::copy_of): parameter i
  // is a copy of the model's parameter `owner` (it draws that one's initial
  // values and takes no model index of its own), or the owner of such a copy.
  void set_copy_of(std::size_t i, std::size_t owner);
  void set_copied(std::size_t i);
  // The indices of tied parameters (owners or copies), in name order: the
  // same list on both stages of a tie, which sum and compare them in that order.
  std::vector<std::size_t> tied() const;
  // A pipeline stage's arena holds runs of the whole model's parameters (one
  // per chunk of layers): the parameters added after set_index_base(base) are
  // the model's base, base + 1, ... Initial values are drawn per model index
  // (nn/init.hpp), so a stage built on its own starts from the same weights as
  // the whole model. A copy of a tied weight has its owner's index, and the
  // parameters after it are not shifted by it.
  void set_index_base(std::size_t base);
  std::size_t model_index(std::size_t i) const;
  // The model index the next parameter added would get: size() unless an index
  // base was set (a layer holding part of its parameters, as an expert rank's
  // MoE layer does, skips the indices of the others).
  std::size_t next_model_index() const;

  Tensor param(std::size_t i) const;
  Tensor grad(std::size_t i) const;
  // The whole flat buffer of one dtype (including alignment padding, which stays zero).
  Tensor params_flat(DType dt = DType::f32) const;
  Tensor grads_flat(DType dt = DType::f32) const;
  std::vector<DType> dtypes() const;  // dtypes present, in a fixed order
  std::int64_t numel() const;         // parameters only, without padding
  Device device() const { return device_; }

  void zero_grads();

  // Changes whenever parameter values may have changed: every call of param()
  // or params_flat() (the views through which anything writes them: the
  // optimizers each step, checkpoint loads, broadcasts, ZeRO gathers) and
  // mark_updated(). Layers that keep a derived copy (a Linear's bfloat16
  // weights) recompute it when the version differs from the one it was made at,
  // so the copy is cast once per step, after the update.
  std::uint64_t version() const { return version_; }
  void mark_updated() const { ++version_; }

 private:
  struct Flat {
    DType dtype;
    std::size_t elems = 0;
    Tensor params, grads;
  };
  Flat& flat(DType dt);
  const Flat& flat(DType dt) const;

  std::vector<ParamInfo> infos_;
  std::vector<Flat> flats_;
  Device device_ = Device::cpu();
  // (first arena index, its model index) of each run, ascending.
  std::vector<std::pair<std::size_t, std::size_t>> bases_{{0, 0}};
  bool finalized_ = false;
  mutable std::uint64_t version_ = 0;
};

}  // namespace ringtrain
