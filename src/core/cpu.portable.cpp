// cpu.hpp on any architecture without its own file: no SIMD features claimed,
// the default floating-point mode, a compiler barrier as the spin hint.
#include <atomic>

#include "ringtrain/core/cpu.hpp"

namespace ringtrain {

const CpuFeatures& cpu_features() {
  static const CpuFeatures none{};
  return none;
}

void flush_denormals() {}

void cpu_relax() { std::atomic_signal_fence(std::memory_order_seq_cst); }

}  // namespace ringtrain
