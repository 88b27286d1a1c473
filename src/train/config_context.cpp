// parallel.context and parallel.context_mode: their range and the features it does not combine with yet,
// refused by name at validation (alike on every rank, before any rank waits).
#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/context_parallel.hpp"
#include "ringtrain/train/config.hpp"

namespace ringtrain {

void TrainConfig::check_context() const {
  const int P = parallel.context;
  RT_CHECK(P >= 1 && P <= 4096, "configuration key 'parallel.context' must be in [1, 4096], got ", P);
  const ContextMode mode = parse_context_mode(parallel.context_mode);
  if (P == 1) return;
  RT_CHECK(model.name == "gpt", "parallel.context = ", P, " splits the tokens of a causal language model: it needs "
           "model.name = 'gpt', got '", model.name, "'");
  // bf16: float32 activations, the projections' products in bf16, the attention core in float32
  // (transformer.hpp). fp16's loss scaling has not been run with it.
  RT_CHECK(train.precision != "fp16", "parallel.context = ", P, ": train.precision = fp16 is not supported with it "
           "yet (use bf16 or fp32)");
  // Ulysses gives each context rank heads / (tensor x context) whole heads: refused here, alike on every rank.
  const int local = parallel.tensor > 0 && model.heads % parallel.tensor == 0 ? model.heads / parallel.tensor : 0;
  RT_CHECK(mode != ContextMode::alltoall || (local > 0 && local % P == 0), "parallel.context_mode = alltoall: "
           "model.heads = ", model.heads, parallel.tensor > 1 ? cat(" over parallel.tensor = ", parallel.tensor,
           " leaves ", local, " heads per tensor rank, which are") : std::string(" is"), " not divisible by "
           "parallel.context = ", P, " (each context rank attends over the whole sequence for heads / context of "
           "them); use parallel.context_mode = ring or a head count divisible by ", parallel.tensor * P);
  // train.device = cuda: the ring and the all-to-all run on device tensors (Backend::ring_block_*, copy_rows),
  // on the GPU validation gate's list ("context parallelism", train/gpu_gate.cpp) since an H200 ran them.
}

}  // namespace ringtrain
