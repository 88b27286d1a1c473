#pragma once
// What a run needs to start, stop and continue safely (trainer-internal):
// run ids, the run identity that `--resume auto` matches, the
// checks that a checkpoint can continue this run bit for bit, the metrics
// file's resume bookkeeping, and the start-up checks of the data files.
#include <string>
#include <vector>

#include "ringtrain/data/schema.hpp"
#include "ringtrain/train/config.hpp"
#include "ringtrain/train/state.hpp"

namespace ringtrain::run_state {

// "20261123-120102-3fa9c2": UTC start time and 24 random bits.
std::string new_run_id();
// The run regardless of layout: a hash of the keys that shape the trajectory
// (not log.*, checkpoint.*, timeouts, train.max_steps, threads, reporting,
// ...) without parallel.*,
// data.batch_size and train.accumulation, with the global batch (data.batch_size
// x data-parallel size x train.accumulation). `--resume auto` continues a
// checkpoint of the same identity at any layout and rank count.
std::string run_identity(const TrainConfig& cfg, std::int64_t global_batch);
// Throws an Error naming the keys when `ck` (read from `file`) cannot continue
// this run: another global batch, seed or (with a padded tail) number of steps
// per epoch would change the data order or the schedule. The layout and the
// split of the global batch into per-rank batch and accumulation may differ.
void check_resumable(const RunPosition& ck, const std::string& file, const TrainConfig& cfg,
                     std::int64_t data_parallel, std::int64_t steps_per_epoch);
// Removes the epoch records of run `run_id` beyond `epochs_done` from a metrics
// file (the resumed run writes them again): a reader never sees an epoch twice.
// Returns the number of records dropped.
int truncate_metrics(const std::string& path, const std::string& run_id, std::int64_t epochs_done);
// Every file of data.train / data.test: readable, finite normalisation, and the
// test split matching the training split's shape and classes. Errors name the key and the file.
void check_data_files(const TrainConfig& cfg, const data::FileInfo& train, bool with_test);

}  // namespace ringtrain::run_state
