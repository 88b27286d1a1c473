#pragma once
// ModelState: a rank's part of the model state (its stage's parameters and
// buffers, its optimizer state or ZeRO-1 slice, the fp16 loss scale) under
// the names of the checkpoint layout (train/state.hpp), which is the same at
// every layout: "param/<name>", "buffer/<name>", "optim/<slot>/<name>",
// "optim/step". A run saved at tensor 2 x pipeline 2 resumes at data 4 and back.
// A tied weight's copy on the last pipeline stage (ParamInfo::copy_of) has its
// owner's names: written once, by the owner's stage, and restored from there.
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/nn/parameters.hpp"
#include "ringtrain/parallel/grid.hpp"

namespace ringtrain {

class Optimizer;
class Stage;
class Updater;

using NamedState = std::vector<std::pair<std::string, Tensor>>;

class ModelState {
 public:
  ModelState(const ProcessGrid& grid, Stage& stage, Updater& updater);

  // This stage's state as views, per parameter; ZeRO-1's optimizer names only
  // when `whole_opt` (a gathered or empty whole optimizer) is given.
  NamedState named(Optimizer* whole_opt = nullptr);
  // What every data-parallel replica must hold bit for bit (flat buffers:
  // few large messages), for train.verify_every and the start-up broadcast.
  // ZeRO-3: the parameters are whole only after ShardedOptimizer::materialize().
  NamedState replicated();
  // A weight tied across pipeline stages as this stage holds it (the first
  // stage's owner, the last stage's copy, ParamInfo::copy_of), in name order:
  // what the two ends of the pipeline (grid.ends()) hold bit for bit. Empty
  // on the stages between and at pipeline 1.
  NamedState tied();
  // Every replica takes data-parallel rank 0's parameters, buffers, optimizer
  // state and loss scale (the start of a run: one source of truth).
  void broadcast();
  // The whole model's state on world rank `root`, tensor-parallel shards
  // gathered whole (every stage's, from data-parallel rank 0, in stage order;
  // "optim/step", held by every stage alike, once); empty elsewhere.
  // Collective over the world.
  NamedState gather_whole(int root = 0);
  // This rank's share of the whole model's state for a checkpoint written by
  // every rank (no communication): its tensor shards and ZeRO-1 slices, and
  // for what several ranks hold alike (replicas, tensor-replicated tensors)
  // an equal byte range of the concatenation, so the writes balance. Views of
  // live memory. The pieces of every rank cover each whole tensor of
  // gather_whole exactly once.
  std::vector<StatePiece> pieces();
  // What this rank restores from a checkpoint, as pieces of the whole
  // tensors with their places (as pieces() writes them): its stage's tensors,
  // its tensor-parallel shards, and with ZeRO-1 only its optimizer slices and
  // step count. `pieces` are host memory to fill (views of the live state; a
  // copy of a device tensor), then `finish` moves the copies onto the device.
  // No communication; nothing whole is built on any rank.
  struct Restoration {
    std::vector<StatePiece> pieces;
    std::function<void()> finish;
  };
  Restoration restoration(bool with_optimizer);

 private:
  NamedState whole_stage(Optimizer* whole_opt);  // this stage, shards whole

  const ProcessGrid& grid_;
  Stage& stage_;
  Updater& updater_;
};

}  // namespace ringtrain
