// The start-up check that all ranks run the engine with settings that lead to
// identical batches and collectives.
#include <string>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/engine/engine.hpp"

namespace ringtrain {

// Every setting that shapes the batches or the collectives must agree, or
// ranks would issue different collectives and hang. One MIN all-reduce of
// (v, -v) gives min and max of each.
void check_engine_settings_agree(const Communicator& comm, const EngineOptions& o) {
  // Each named by its option and the configuration key that sets it in a training run.
  const char* names[] = {"fusion_threshold (comm.fusion_threshold)", "fp16_allreduce (comm.fp16_allreduce)",
                         "cache_capacity (comm.cache_capacity)", "collective.algorithm (comm.algorithm)",
                         "collective.tree_threshold (comm.tree_threshold)",
                         "collective.segment_bytes (comm.segment_bytes)", "autotune.enabled (comm.autotune)",
                         "autotune.samples (comm.autotune_samples)", "autotune.steps_per_sample (comm.autotune_steps)"};
  long long v[] = {static_cast<long long>(o.fusion_threshold), o.fp16_allreduce ? 1 : 0,
                   static_cast<long long>(o.cache_capacity), static_cast<long long>(o.collective.algorithm),
                   effective_tree_threshold(o.collective),
                   static_cast<long long>(effective_segment_bytes(o.collective)), o.autotune.enabled ? 1 : 0,
                   o.autotune.samples, o.autotune.steps_per_sample};
  constexpr int n = sizeof(v) / sizeof(v[0]);
  long long mm[2 * n];
  for (int i = 0; i < n; ++i) {
    mm[i] = v[i];
    mm[n + i] = -v[i];
  }
  bounded::allreduce(mm, 2 * n, MPI_LONG_LONG, MPI_MIN, WaitOn(comm, "Engine start-up"),
                     "Engine start-up: the all-reduce of the settings");
  std::string bad;
  for (int i = 0; i < n; ++i)
    if (mm[i] != -mm[n + i]) bad += cat(bad.empty() ? "" : "; ", names[i], " ranges from ", mm[i], " to ", -mm[n + i]);
  RT_CHECK(bad.empty(), "Engine: ranks disagree on engine settings: ", bad,
           ". Every rank must use the same fusion engine settings");
}

}  // namespace ringtrain
