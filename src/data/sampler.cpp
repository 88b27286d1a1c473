#include "ringtrain/data/sampler.hpp"

#include <algorithm>
#include <numeric>
#include <random>

#include "ringtrain/core/error.hpp"
#include "rng.hpp"

namespace ringtrain::data {

Sampler::Sampler(const SamplerConfig& cfg, std::vector<std::int64_t> shard_counts)
    : cfg_(cfg), counts_(std::move(shard_counts)) {
  const int p = cfg.ranks;
  const std::int64_t b = cfg.batch;
  RT_CHECK(p >= 1 && cfg.rank >= 0 && cfg.rank < p, "sampler: rank ", cfg.rank, " of ", p, " ranks");
  RT_CHECK(b >= 1, "batch size ", b, " must be >= 1");
  for (auto c : counts_) first_.push_back(total_), total_ += c;
  RT_CHECK(total_ >= p, "fewer samples (", total_, ") than ranks (", p, ")");
  if (cfg.mode == ShuffleMode::global) {
    shards_.resize(counts_.size());
    std::iota(shards_.begin(), shards_.end(), 0);
    const std::int64_t G = p * b;
    RT_CHECK(G <= total_, "batch larger than the data set: ", p, " ranks x batch ", b, " = ", G, " > ", total_,
             " samples");
    steps_ = cfg.tail == TailPolicy::pad ? (total_ + G - 1) / G : total_ / G;
    return;
  }
  const int K = int(counts_.size());
  RT_CHECK(K >= p, "shard-local shuffling needs at least one shard per rank: ", K, " shards for ", p,
           " ranks (use the global shuffle mode)");
  std::int64_t lo = INT64_MAX, hi = 0;
  for (int r = 0; r < p; ++r) {
    std::int64_t n = 0;
    for (int s = r; s < K; s += p) n += counts_[s];
    RT_CHECK(b <= n, "batch larger than the shard: batch ", b, " > ", n, " samples in the shards of rank ", r);
    lo = std::min(lo, n / b), hi = std::max(hi, (n + b - 1) / b);
  }
  steps_ = cfg.tail == TailPolicy::pad ? hi : lo;
  for (int s = cfg.rank; s < K; s += p) {
    shards_.push_back(s);
    for (std::int64_t i = 0; i < counts_[s]; ++i) local_ids_.push_back(first_[s] + i);
  }
}

std::int64_t Sampler::local_samples() const {
  return cfg_.mode == ShuffleMode::global ? total_ : std::int64_t(local_ids_.size());
}

const std::vector<std::int64_t>& Sampler::order(std::int64_t epoch) {
  if (epoch == cached_epoch_) return order_;
  if (cfg_.mode == ShuffleMode::global) {
    order_.resize(total_);
    std::iota(order_.begin(), order_.end(), 0);
    if (cfg_.shuffle) {
      std::mt19937_64 rng(mix_seed(cfg_.seed, std::uint64_t(epoch), 0x9106a1));
      shuffle(order_, rng);
    }
  } else {
    order_ = local_ids_;
    if (cfg_.shuffle) {
      std::mt19937_64 rng(mix_seed(cfg_.seed, std::uint64_t(epoch), 0x5a4d + std::uint64_t(cfg_.rank)));
      shuffle(order_, rng);
    }
  }
  cached_epoch_ = epoch;
  return order_;
}

std::int64_t Sampler::batch(std::int64_t epoch, std::int64_t step, std::vector<std::int64_t>& ids) {
  RT_CHECK(step >= 0 && step < steps_, "step ", step, " outside the epoch's ", steps_, " steps");
  const auto& o = order(epoch);
  const std::int64_t b = cfg_.batch, n = std::int64_t(o.size());
  const std::int64_t start = cfg_.mode == ShuffleMode::global ? step * b * cfg_.ranks + cfg_.rank * b : step * b;
  ids.resize(b);
  for (std::int64_t i = 0; i < b; ++i) ids[i] = o[(start + i) % n];
  return std::clamp<std::int64_t>(n - start, 0, b);
}

}  // namespace ringtrain::data
