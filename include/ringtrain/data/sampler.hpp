#pragma once
// Which samples each rank reads at each step. Rules kept:
//  - global mode (default, exact): a permutation π_e of [0, N) from
//    (seed, epoch) (mt19937_64 + our own Fisher–Yates: identical on every
//    build). With p ranks and per-rank batch b, G = p·b; step k of rank r takes
//    permuted positions k·G + r·b + i, i < b: a contiguous block per rank, so
//    the union of the ranks' batches at step k, concatenated by rank, IS the
//    1-rank batch k of size G under the same seed (PyTorch strides instead;
//    blocks give the trainer's "2×32 == 1×64" exactness at every step).
//  - tail: pad (default) rounds the epoch up to a multiple of G, positions
//    j >= N wrap to π(j mod N), so every sample is seen and Batch::valid counts
//    the non-padding samples; drop_last rounds down. Either way every rank has
//    the same number of steps and every batch has exactly b samples (G <= N is
//    required).
//  - shard_local mode ("shard-local shuffling"): rank r owns shards s with
//    s % p == r and shuffles only their samples, by (seed, epoch, r). Cheap
//    sequential I/O, but NOT a global shuffle and not rank-count invariant.
//    Steps per epoch: drop_last = min over ranks of ⌊n_r / b⌋, pad = max of
//    ⌈n_r / b⌉ (shorter ranks wrap), so every rank steps the same number of times.
#include <cstdint>
#include <vector>

namespace ringtrain::data {

enum class ShuffleMode { global, shard_local };
enum class TailPolicy { pad, drop_last };

struct SamplerConfig {
  std::int64_t batch = 1;  // per rank
  int ranks = 1, rank = 0;
  std::uint64_t seed = 0;
  bool shuffle = true;     // false: identity order (evaluation)
  ShuffleMode mode = ShuffleMode::global;
  TailPolicy tail = TailPolicy::pad;
};

class Sampler {
 public:
  // shard_counts[s] samples in shard s, shards concatenated in order give global ids.
  Sampler(const SamplerConfig& cfg, std::vector<std::int64_t> shard_counts);

  std::int64_t steps_per_epoch() const { return steps_; }
  std::int64_t num_samples() const { return total_; }
  // Samples of this rank (global mode: all N; shard_local: its shards).
  std::int64_t local_samples() const;
  // Global sample ids of this rank's batch at (epoch, step), in batch order;
  // returns how many leading ids are not padding (< b only in the pad tail).
  std::int64_t batch(std::int64_t epoch, std::int64_t step, std::vector<std::int64_t>& ids);
  // Shards this rank reads (all of them in global mode).
  const std::vector<int>& shards() const { return shards_; }
  const SamplerConfig& config() const { return cfg_; }

 private:
  const std::vector<std::int64_t>& order(std::int64_t epoch);
  SamplerConfig cfg_;
  std::vector<std::int64_t> counts_, first_;
  std::vector<int> shards_;
  std::vector<std::int64_t> local_ids_;  // shard_local: this rank's global ids, unshuffled
  std::int64_t total_ = 0, steps_ = 0;
  std::int64_t cached_epoch_ = -1;
  std::vector<std::int64_t> order_;
};

}  // namespace ringtrain::data
