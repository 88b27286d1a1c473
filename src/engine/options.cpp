// EngineOptions::from_env and the start-up check that all ranks run the
// engine with settings that lead to identical batches and collectives.
#include <cerrno>
#include <cstdlib>
#include <string>

#include "ringtrain/core/error.hpp"
#include "ringtrain/engine/engine.hpp"

namespace ringtrain {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

double env_double(const char* name, double lo) {
  const char* v = env(name);
  char* end = nullptr;
  errno = 0;
  double d = std::strtod(v, &end);
  RT_CHECK(end != v && *end == '\0' && errno == 0 && d >= lo, "environment variable ", name, "='", v,
           "' is not a number >= ", lo);
  return d;
}

long long env_int(const char* name, long long lo) {
  const char* v = env(name);
  char* end = nullptr;
  errno = 0;
  long long d = std::strtoll(v, &end, 10);
  RT_CHECK(end != v && *end == '\0' && errno == 0 && d >= lo, "environment variable ", name, "='", v,
           "' is not an integer >= ", lo);
  return d;
}

bool env_bool(const char* name) {
  std::string v = env(name);
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  RT_FAIL("environment variable ", name, "='", v, "' is not a boolean (0/1, true/false, on/off)");
}

}  // namespace

EngineOptions EngineOptions::from_env() { return from_env(EngineOptions{}); }

EngineOptions EngineOptions::from_env(EngineOptions o) {
  if (env("RINGTRAIN_FUSION_THRESHOLD")) o.fusion_threshold = env_int("RINGTRAIN_FUSION_THRESHOLD", 0);
  if (env("RINGTRAIN_CYCLE_TIME")) o.cycle_time_ms = env_double("RINGTRAIN_CYCLE_TIME", 0);
  if (env("RINGTRAIN_CACHE_CAPACITY")) o.cache_capacity = env_int("RINGTRAIN_CACHE_CAPACITY", 0);
  if (env("RINGTRAIN_FP16_ALLREDUCE")) o.fp16_allreduce = env_bool("RINGTRAIN_FP16_ALLREDUCE");
  if (env("RINGTRAIN_BACKWARD_PASSES_PER_STEP"))
    o.backward_passes_per_step = static_cast<int>(env_int("RINGTRAIN_BACKWARD_PASSES_PER_STEP", 1));
  if (const char* v = env("RINGTRAIN_TIMELINE")) o.timeline = v;
  if (env("RINGTRAIN_TIMELINE_ALL_RANKS")) o.timeline_all_ranks = env_bool("RINGTRAIN_TIMELINE_ALL_RANKS");
  if (env("RINGTRAIN_STALL_CHECK_TIME_SECONDS"))
    o.stall_warning_s = env_double("RINGTRAIN_STALL_CHECK_TIME_SECONDS", 0);
  if (env("RINGTRAIN_STALL_SHUTDOWN_TIME_SECONDS"))
    o.stall_shutdown_s = env_double("RINGTRAIN_STALL_SHUTDOWN_TIME_SECONDS", 0);
  if (const char* v = env("RINGTRAIN_ALLREDUCE_ALGORITHM")) o.collective.algorithm = parse_algorithm(v);
  return o;
}

// Every setting that shapes the batches or the collectives must agree, or
// ranks would issue different collectives and hang. One MIN all-reduce of
// (v, -v) gives min and max of each.
void check_engine_settings_agree(const Communicator& comm, const EngineOptions& o) {
  const char* names[] = {"fusion_threshold (RINGTRAIN_FUSION_THRESHOLD)", "fp16_allreduce (RINGTRAIN_FP16_ALLREDUCE)",
                         "cache_capacity (RINGTRAIN_CACHE_CAPACITY)",
                         "collective.algorithm (RINGTRAIN_ALLREDUCE_ALGORITHM)",
                         "collective tree threshold (RINGTRAIN_TREE_THRESHOLD)",
                         "collective segment size (RINGTRAIN_SEGMENT_BYTES)",
                         "backward_passes_per_step (RINGTRAIN_BACKWARD_PASSES_PER_STEP)"};
  long long v[] = {static_cast<long long>(o.fusion_threshold), o.fp16_allreduce ? 1 : 0,
                   static_cast<long long>(o.cache_capacity), static_cast<long long>(o.collective.algorithm),
                   effective_tree_threshold(o.collective),
                   static_cast<long long>(effective_segment_bytes(o.collective)), o.backward_passes_per_step};
  constexpr int n = sizeof(v) / sizeof(v[0]);
  long long mm[2 * n];
  for (int i = 0; i < n; ++i) {
    mm[i] = v[i];
    mm[n + i] = -v[i];
  }
  RT_CHECK(MPI_Allreduce(MPI_IN_PLACE, mm, 2 * n, MPI_LONG_LONG, MPI_MIN, comm.handle("Engine start-up")) ==
               MPI_SUCCESS,
           "Engine start-up: MPI_Allreduce of the settings failed");
  std::string bad;
  for (int i = 0; i < n; ++i)
    if (mm[i] != -mm[n + i]) bad += cat(bad.empty() ? "" : "; ", names[i], " ranges from ", mm[i], " to ", -mm[n + i]);
  RT_CHECK(bad.empty(), "Engine: ranks disagree on engine settings: ", bad,
           ". Every rank must use the same fusion engine settings");
}

}  // namespace ringtrain
