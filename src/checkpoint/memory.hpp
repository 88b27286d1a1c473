#pragma once
// checkpoint.memory_every_steps: in-memory snapshots kept on a buddy node.
//
// Every k steps each rank builds what its checkpoint part holds, in the part
// file's format (write_checkpoint's image: one format, one reader), plus the
// position a manifest holds, and on a helper thread
//  - writes it atomically (temporary file, rename) under its node's
//    sub-directory of checkpoint.memory_dir (/dev/shm by default: host memory
//    that outlives the process, not the node);
//  - sends the same bytes to its buddy: the rank at the same local index on
//    the next node (wrapping), which writes them under ITS node's directory.
// The helper ends each snapshot with a barrier of every rank's helper, and
// the trainer waits for it at the end of the step after the snapshot (the
// helper overlaps that one step): once step s + 1 is reported, the snapshot
// of step s is complete on every holder, so a node lost at any step costs at
// most k steps. Each holder keeps the two newest snapshots of every part it
// holds (the newer may be in flight, the older is complete).
//
// Nodes are the hosts (an all-gather of host names; the same split as MPI's
// shared-memory one), or, with checkpoint.memory_node_ranks = n, every n
// consecutive ranks (tests on one machine: each emulated node has its own
// directory; deleting it is losing the node). On one node there is no other
// node to hold a copy: the snapshot is kept locally only (logged).
//
// On `--resume auto` (recover(), collective): every rank verifies the
// snapshot files it sees (the ranks of one host share them out), the ranks
// all-gather what verified, and agree on the newest step whose every part is
// held by some rank. Unless a disk checkpoint of that run is as new, the
// holders copy those parts into checkpoint.dir and rank 0 writes their
// manifest: an ordinary parallel checkpoint, which the usual reader then
// loads at any layout, bitwise.
#include <atomic>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/train/config.hpp"
#include "async_writer.hpp"

namespace ringtrain {

class MemorySnapshots {
 public:
  MemorySnapshots(const TrainConfig& cfg, const Communicator& world) : cfg_(cfg), world_(world) {}
  // (The helper's AsyncWriter waits for a snapshot in flight when destroyed.)

  bool on() const { return cfg_.checkpoint.memory_every_steps > 0 && !cfg_.checkpoint.dir.empty(); }
  bool due(std::int64_t step) const { return on() && step > 0 && step % cfg_.checkpoint.memory_every_steps == 0; }
  // Collective, once: nodes and buddies, the helper's communicator, the directory.
  void start();
  // Collective, at the start of training: every snapshot file under the
  // directory is removed (each host's lowest rank), as its contents are now in
  // a disk checkpoint or superseded.
  void clear();
  // Waits for the snapshot in flight: complete on every holder then (its
  // memory may be reused); a failure there was logged as a warning and costs
  // nothing else.
  void wait();
  bool busy() const { return writer_.busy(); }
  // `part`: this rank's part at `step` (private tensors), with the position.
  // Returns at once; the write and the exchange run on the helper thread.
  void save(std::int64_t step, const std::string& run_id, CheckpointData part);
  void finish() { writer_.wait(); }

  // Collective (--resume auto): makes the newest complete snapshot newer than
  // every disk checkpoint of its run a checkpoint in checkpoint.dir. `identity`:
  // the run identity a snapshot must have. Logs the source chosen and why.
  void recover(const std::string& identity);

  // Where this rank's node keeps its snapshots.
  const std::string& node_dir() const { return node_dir_; }
  std::size_t last_bytes() const { return last_bytes_.load(); }
  // Each snapshot's time on the helper thread (build, write, exchange, the
  // buddy's copy written); read after finish().
  const std::vector<double>& helper_s() const { return helper_s_; }

 private:
  void exchange(const std::vector<char>& image, std::vector<std::vector<char>>& received);
  void prune(const std::string& run_id, std::int64_t keep_from) const;
  void written_everywhere();  // the helper's bounded barrier: every holder wrote this snapshot

  const TrainConfig& cfg_;
  const Communicator& world_;
  bool started_ = false;
  std::string dir_, node_dir_;
  int buddy_ = -1;            // world rank, -1: none (one node)
  std::vector<int> senders_;  // the ranks whose buddy this rank is
  std::set<int> held_;        // parts this rank writes: its own and its senders'
  std::vector<double> helper_s_;  // appended by the helper, read after finish()
  std::vector<std::int64_t> steps_;  // the steps this rank saved, newest last
  std::atomic<std::size_t> last_bytes_{0};  // the last snapshot's size (set by the helper)
  Communicator comm_;         // world's duplicate, used by the helper thread only
  AsyncWriter writer_{false};  // at training's priority (the next snapshot waits for it); last member: joined first
};

}  // namespace ringtrain
