// check_environment (config.hpp): configuration keys are the one source of a
// run's behaviour. The variables that used to override keys are no longer read;
// one still set is refused naming its key, so that nobody trusts a setting that
// has no effect. A variable still read that overlaps a key must agree with it.
#include <cstdlib>
#include <string>

#include "ringtrain/core/error.hpp"
#include "ringtrain/train/config.hpp"

namespace ringtrain {
namespace {

struct Removed {
  const char* var;
  const char* instead;  // what to set instead
};

constexpr Removed kRemoved[] = {
    {"RINGTRAIN_BACKWARD_PASSES_PER_STEP", "the configuration key train.accumulation (or data.global_batch)"},
    {"RINGTRAIN_COLLECTIVE_TIMEOUT", "the configuration key comm.collective_timeout_s"},
    {"RINGTRAIN_FUSION_THRESHOLD", "the configuration key comm.fusion_threshold"},
    {"RINGTRAIN_CYCLE_TIME", "the configuration key comm.cycle_time_ms"},
    {"RINGTRAIN_CACHE_CAPACITY", "the configuration key comm.cache_capacity"},
    {"RINGTRAIN_FP16_ALLREDUCE", "the configuration key comm.fp16_allreduce"},
    {"RINGTRAIN_TIMELINE", "the configuration key comm.timeline"},
    {"RINGTRAIN_TIMELINE_ALL_RANKS", "the configuration key comm.timeline_all_ranks"},
    {"RINGTRAIN_STALL_CHECK_TIME_SECONDS", "the configuration key comm.stall_warning_s"},
    {"RINGTRAIN_STALL_SHUTDOWN_TIME_SECONDS", "the configuration key comm.stall_shutdown_s"},
    {"RINGTRAIN_ALLREDUCE_ALGORITHM", "the configuration key comm.algorithm"},
    {"RINGTRAIN_TREE_THRESHOLD", "the configuration key comm.tree_threshold"},
    {"RINGTRAIN_SEGMENT_BYTES", "the configuration key comm.segment_bytes"},
    {"RINGTRAIN_TF32", "the configuration key train.precision = tf32"},
    {"RINGTRAIN_SPIN_US", "nothing: a waiting rank's spin time follows the ranks per node and the cores"},
    {"RINGTRAIN_SHM_SMALL", "nothing: the shared-memory sizes are CollectiveOptions in code, measured defaults here"},
    {"RINGTRAIN_SHM_CHUNK", "nothing: the shared-memory sizes are CollectiveOptions in code, measured defaults here"},
};

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

}  // namespace

void check_environment(const TrainConfig& cfg) {
  for (const Removed& r : kRemoved)
    if (const char* v = env(r.var))
      RT_FAIL("environment variable ", r.var, "='", v, "' is no longer read (configuration keys are the one source "
              "of a run's settings): unset it and set ", r.instead, " (docs/environment.md)");
  // The CUDA backend reads this one when it registers, before any configuration exists.
  if (const char* v = env("RINGTRAIN_CUDNN_DETERMINISTIC"); v && std::string(v) == "0" && cfg.comm.deterministic)
    RT_FAIL("environment variable RINGTRAIN_CUDNN_DETERMINISTIC=0 allows cuDNN algorithms that are not "
            "deterministic, but the configuration key comm.deterministic = true asks for bitwise-reproducible "
            "runs: unset the variable or set comm.deterministic = false");
}

}  // namespace ringtrain
