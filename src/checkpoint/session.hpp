#pragma once
// The trainer's checkpoint logic (trainer_checkpoint.cpp says what the state
// is on each layout): the run id and identity, the position scalars, writing with rotation, finding the newest intact
// checkpoint, `--resume auto`, the checks that a checkpoint fits this model and
// run, metrics truncation on resume, the stop announcement.
//
// A trainer hands over its state as WHOLE named tensors (state.hpp's names,
// tensor-parallel shards gathered whole), or with checkpoint.parallel as each
// rank's pieces of them with their places; either way a checkpoint does not
// depend on the layout that wrote it. On load every rank reads only what it
// restores (checkpoint_read.hpp): no rank assembles or receives the whole
// state. Resume rules:
//  - `--resume auto` continues a checkpoint of the same RUN (run_state::
//    run_identity): model, data, optimizer, seed and the other keys that shape
//    the trajectory, and the GLOBAL batch (data.batch_size x data-parallel size
//    x train.accumulation); the layout (parallel.*) and the rank count are not
//    part of it;
//  - an explicit path continues at any layout likewise, as long as the global
//    batch and train.seed are the checkpoint's: parameters and optimizer state
//    load bitwise and the data order and schedule are the same (sums then run
//    in another order: the losses follow up to rounding); other values are
//    refused, naming the keys. data.global_batch keeps the global batch at any
//    layout (run_options.hpp, derive_batch);
//  - a checkpoint of another model or optimizer is an error naming the first
//    tensor that is missing, shaped differently or left over, on every rank,
//    before anything is restored; so is a corrupt one (checksums, NaN/Inf),
//    which a directory's search skips for the next newest.
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/checkpoint/read.hpp"
#include "ringtrain/train/state.hpp"
#include "ringtrain/train/trainer.hpp"
#include "async_writer.hpp"
#include "memory.hpp"

namespace ringtrain {

class CheckpointSession {
 public:
  // Keeps references: all four outlive the session (members of a trainer's Impl).
  CheckpointSession(const TrainConfig& cfg, const Communicator& world, const TrainerHooks& hooks, RunPosition& pos);

  // The run's fixed facts in `pos`: rank count, seed, batch, accumulation,
  // layout, parameter count, steps per epoch and run identity.
  // Called once the model exists.
  void describe_run(std::int64_t params, int pipeline, int tensor, int data_parallel, std::int64_t steps_per_epoch);
  // Collective, at start-up: checkpoint.dir exists or can be made (an error naming the key).
  void create_dir();
  // Collective, at the start of fit(): a fresh run takes rank 0's new run id;
  // temporary files of this run left by a kill or a full disk are removed.
  void start_run();
  // Rank 0, before the metrics file opens on a resumed run: drops this run's
  // epoch records beyond the checkpoint (the resumed run writes them again).
  void truncate_metrics(const std::string& metrics) const;

  // The state for a checkpoint, as the trainer hands it over:
  //  - whole: the whole named state gathered on world rank 0 — collective on
  //    every rank (a sharded optimizer gathers its slices here); {} elsewhere;
  //  - pieces: this rank's share (checkpoint.parallel), no communication.
  // With checkpoint.async either must be a private snapshot.
  struct StateSource {
    std::function<NamedTensorList()> whole;
    std::function<std::vector<StatePiece>()> pieces;
  };
  // checkpoint.parallel at more than one rank: every rank writes its share to
  // a part file and rank 0 commits a manifest once all are durable
  // (checkpoint.hpp); otherwise rank 0 writes one file. Either way through
  // one path: write, then commit once every rank's write is durable.
  bool parallel() const { return cfg_.checkpoint.parallel && world_.size() > 1; }
  // Writes the position as it stands every checkpoint.every_epochs epochs, or
  // always with `force`. Collective. Returns the path on rank 0, "" elsewhere
  // or when nothing was written. With checkpoint.async the file (or the parts)
  // is written in the background: the path is durable after the next save()
  // or finish(), and a parallel checkpoint's manifest follows as soon as
  // after_step() learns that every part is durable. A failed background write
  // is an Error on every rank at the next save() or finish().
  std::string save(bool force, const StateSource& state);
  // Collective: waits until the last checkpoint is durable (the run's end, a stop).
  void finish();
  // Collective: a checkpoint still waiting for its commit (a parallel one's
  // manifest, a one-file one's rotation) is committed now (before an
  // evaluation that could end the run).
  void commit_parts() {
    if (pending_) settle();
  }
  // checkpoint.async: this rank has no file of an uncommitted checkpoint in
  // flight (it is durable, or there is none). The trainers carry it in the
  // step's all-reduce; after_step() gets the verdict.
  bool part_ready() const { return !pending_ || writer_.succeeded(); }
  // After a step: `all_ready` — part_ready() on every rank. Rank 0 then
  // commits the pending checkpoint in the background (manifest, rotation).
  void after_step(bool all_ready);

  struct Restore {
    // Every rank: what it reads (checkpoint_read.hpp: host memory to fill,
    // pieces of the whole tensors with their places; optional targets, as the
    // loss scale, only when the checkpoint holds them). Optimizer state only
    // when asked.
    std::function<std::vector<ReadTarget>(bool with_optimizer)> targets;
    // Every rank, once its targets are filled: puts them in place.
    std::function<void(const std::vector<ReadTarget>&)> finish;
  };
  // Collective: rank 0 lists the candidates (a file, a directory's
  // checkpoints newest first, or "auto": this run's in checkpoint.dir); the
  // ranks index the newest together, verify it (a corrupt one is skipped for
  // the next), check it against the model and the run, and each reads its
  // targets. With the optimizer, `pos` continues the checkpoint's run.
  // Returns false when --resume auto found nothing (a fresh start).
  bool load(const std::string& path, bool with_optimizer, const Restore& restore, std::int64_t steps_per_epoch);

  // Rank 0: the stop's log line. `agreed`: the signal, or -1 when it reached another rank.
  void announce_stop(int agreed, std::int64_t steps_in_epoch, std::int64_t steps_per_epoch,
                     const std::string& checkpoint) const;

  bool resumed() const { return resumed_; }

  // checkpoint.memory_every_steps (memory.hpp): a snapshot is due after `step`.
  bool memory_due(std::int64_t step) const { return memory_.due(step); }
  // Collective, at the start of training: the snapshots of earlier runs go
  // (their state is in a checkpoint now, or superseded).
  void memory_start() { memory_.clear(); }
  // After the previous snapshot is done, `pieces` (this rank's share, private
  // copies: the caller's snapshot) with the position go to memory and the
  // buddy in the background. No communication on this thread.
  void memory_save(const std::function<std::vector<StatePiece>()>& pieces);
  // The snapshot in flight complete on every holder (memory.hpp): the trainer
  // calls it at the end of the step after a snapshot, so lost work <= k.
  void memory_settle() { memory_.wait(); }
  const MemorySnapshots& memory() const { return memory_; }

  // checkpoint.every_steps: a checkpoint is due after global step `step`.
  // Every rank computes the same answer from the position alone.
  bool due_after_step(std::int64_t step) const {
    return !cfg_.checkpoint.dir.empty() && cfg_.checkpoint.every_steps > 0 && step % cfg_.checkpoint.every_steps == 0;
  }
  // checkpoint.every_s, on rank 0 only (its clock decides; the trainers carry
  // the answer to every rank in the step's all-reduce): that long since the
  // last checkpoint, or since the run started.
  bool time_due() const {
    return world_.rank() == 0 && !cfg_.checkpoint.dir.empty() && cfg_.checkpoint.every_s > 0 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_).count() >=
               cfg_.checkpoint.every_s;
  }

  // What the last successful load() read, and how many bytes this rank read.
  const LoadedCheckpoint& loaded() const { return loaded_; }

 private:
  void check_names(const CheckpointIndex& ix, const std::vector<ReadTarget>& targets, bool with_optimizer) const;
  void log_layout_change(const RunPosition& ck) const;
  void settle();                  // collective: the last write durable (or its error everywhere), committed
  void commit(bool background);   // every rank: rank 0 commits the pending checkpoint, every rank forgets it

  const TrainConfig& cfg_;
  const Communicator& world_;
  const TrainerHooks& hooks_;
  RunPosition& pos_;
  bool resumed_ = false;
  std::string config_toml_;       // stored in every checkpoint
  LoadedCheckpoint loaded_;
  std::chrono::steady_clock::time_point last_save_ = std::chrono::steady_clock::now();
  // A checkpoint whose files are being written: its manifest (rank 0's copy, parallel only).
  struct Pending {
    std::int64_t step = 0;
    CheckpointData manifest;
  };
  std::optional<Pending> pending_;
  MemorySnapshots memory_{cfg_, world_};
  AsyncWriter writer_;  // checkpoint.async: the background write (last member: joined first)
};

}  // namespace ringtrain
