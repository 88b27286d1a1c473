// Context parallelism (nn/context_parallel.hpp): what ring (and all-to-all) attention costs
// each rank of a context group of P = world size, with the bound beside each
// figure. Run under mpirun at P ranks (one OpenMP thread per rank):
//   mpirun -np 2 build/bench/bench_parallel_context --tokens 4096
//  1. per-rank attention arithmetic (forward + backward, the ring's compute
//     time in thread CPU seconds, so that oversubscribed cores do not count),
//     max/min over the ranks, head-tail split vs a contiguous split
//     (contiguous: rank r's queries see r + 1/2 blocks of keys, so
//     max/min = 2P − 1: 3.0 at P = 2);
//  2. bytes each rank sends per layer in the forward vs 2·N·T·d·(P−1)/P
//     floats (K and V of its T/P tokens, P−1 times; T padded to 2P·c);
//  2b. the rank that waited most: the wall time it spent waiting for blocks
//     after its arithmetic, against that arithmetic (transfers hidden: <= 0.1);
//  3. per-rank activation bytes of an embedding + `depth` causal transformer
//     blocks kept for the backward, context P vs the same layers at context 1
//     (measured on each rank alone), against 1/P; the ring's workspace (the
//     K/V blocks in flight, one set per group) printed apart.
//  4. parallel.context_mode = alltoall (Ulysses, when P divides the heads):
//     its per-rank arithmetic (the inner causal kernel over the whole
//     sequence for H/P heads), its exchanges, its forward bytes against
//     4·N·T·d·(P−1)/P² floats (q, k, v and the output each cross once, each
//     rank keeping 1/P: 2/P of the ring's), and the wall time of a forward +
//     backward pass per rank in both modes (the slowest rank; with more ranks
//     than cores this includes queueing for a core), its backward bytes and
//     its activation bytes as in 3.
//  5. the whole step of those blocks (forward + backward of every layer, ring
//     mode): the rank that waited most for blocks, its step time against the
//     same step less those waits (the compute-only time of the same split;
//     goal <= 1.1).
#include <mpi.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/allocator.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/context_parallel.hpp"
#include "ringtrain/nn/language.hpp"
#include "ringtrain/nn/transformer.hpp"

using namespace ringtrain;

namespace {

Tensor random(const Shape& s, unsigned seed) {
  Tensor t = Tensor::empty(s);
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(g);
  return t;
}

struct Ring {
  double cpu_max = 0, cpu_min = 0, fwd_bytes = 0;
  double compute = 0, wait = 0;  // wall seconds per pass, the rank that waited most
  double wall = 0;               // wall seconds of a forward + backward pass, the slowest rank
  double bwd_bytes = 0;          // sent per backward
};

Ring run_ring(const Communicator& world, std::int64_t N, std::int64_t T, std::int64_t H, std::int64_t hd, int reps,
              bool contiguous, ContextMode mode = ContextMode::ring) {
  AttentionSpec s;
  s.heads = H, s.head_dim = hd, s.causal = true;
  auto stats = std::make_shared<RingStats>();
  ContextGroup g = ContextGroup::of(world, T, stats);
  g.contiguous = contiguous;
  g.mode = mode;
  auto k = context_attention(s, g, backend_for(DeviceKind::cpu));
  const std::int64_t d = H * hd;
  const Tensor qkv = context_slice(random({N, T, 3 * d}, 1), g), dy = context_slice(random({N, T, d}, 2), g);
  Tensor out = Tensor::empty({N, g.local(), d}), dx = Tensor::empty({N, g.local(), 3 * d});
  KernelStatePtr st;
  k->forward(qkv, out, state_in(st, *k));  // warm-up
  k->backward(qkv, dy, dx, state_in(st, *k));
  stats->reset();
  MPI_Barrier(world.handle("bench"));
  double wall = MPI_Wtime();
  for (int r = 0; r < reps; ++r) {
    k->forward(qkv, out, state_in(st, *k));
    k->backward(qkv, dy, dx, state_in(st, *k));
  }
  wall = MPI_Wtime() - wall;
  MPI_Allreduce(MPI_IN_PLACE, &wall, 1, MPI_DOUBLE, MPI_MAX, world.handle("bench"));
  double mx = stats->compute_cpu_s, mn = stats->compute_cpu_s;
  MPI_Allreduce(MPI_IN_PLACE, &mx, 1, MPI_DOUBLE, MPI_MAX, world.handle("bench"));
  MPI_Allreduce(MPI_IN_PLACE, &mn, 1, MPI_DOUBLE, MPI_MIN, world.handle("bench"));
  struct {
    double wait;
    int rank;
  } w{stats->wait_s, world.rank()};
  MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_DOUBLE_INT, MPI_MAXLOC, world.handle("bench"));
  double compute = stats->compute_s;
  MPI_Bcast(&compute, 1, MPI_DOUBLE, w.rank, world.handle("bench"));
  return {mx / reps, mn / reps, stats->fwd_bytes_sent / double(stats->forwards), compute / reps, w.wait / reps,
          wall / reps, (stats->bytes_sent - stats->fwd_bytes_sent) / double(stats->backwards)};
}

// An embedding and `depth` causal blocks, split over `comm` as parallel.context does.
struct Blocks {
  std::vector<LayerPtr> layers;
  ParamArena arena;
  ContextGroup cg;
};
std::unique_ptr<Blocks> build_blocks(const Communicator& comm, std::int64_t T, std::int64_t D, std::int64_t H, int depth,
                                     ContextMode mode, std::shared_ptr<RingStats> stats = nullptr) {
  auto b = std::make_unique<Blocks>();
  b->layers.push_back(std::make_unique<TokenEmbedding>("wte", 256, T, D));
  TransformerBlockSpec bs;
  bs.dim = D, bs.heads = H, bs.causal = true;
  for (int i = 0; i < depth; ++i) b->layers.push_back(transformer_block(cat("blocks.", i), bs));
  b->cg = ContextGroup::of(comm, T, std::move(stats));
  b->cg.mode = mode;
  if (comm.size() > 1) shard_context(b->layers, b->cg);
  for (std::size_t i = 0; i < b->layers.size(); ++i) b->layers[i]->register_params(b->arena, int(i), "");
  b->arena.finalize();
  for (auto& l : b->layers) {
    l->bind(BindContext{backend_for(DeviceKind::cpu), Device::cpu(), b->arena, 1});
    l->init(b->arena, 1);
  }
  return b;
}

Tensor token_ids(std::int64_t N, std::int64_t T) {
  Tensor ids = Tensor::empty({N, T});
  for (std::int64_t i = 0; i < ids.numel(); ++i) ids.data<float>()[i] = float(i % 251);
  return ids;
}

// Host bytes that an embedding and `depth` causal blocks keep from their
// forward for the backward, and the ring's workspace among them (shared by the blocks).
struct Activations {
  double kept = 0, workspace = 0;
};
Activations activation_bytes(const Communicator& comm, std::int64_t N, std::int64_t T, std::int64_t D,
                             std::int64_t H, int depth, ContextMode mode = ContextMode::ring) {
  const auto b = build_blocks(comm, T, D, H, depth, mode);
  const Tensor ids = token_ids(N, T);
  std::vector<CtxPtr> ctx;
  for (auto& l : b->layers) ctx.push_back(l->make_ctx());
  const std::size_t before = host_memory_stats().live;
  Tensor x = ids;
  for (std::size_t i = 0; i < b->layers.size(); ++i) x = b->layers[i]->forward(x, *ctx[i], Call(Mode::train));
  // The contexts (and the output) are alive; the workspace is the ring's, once per group.
  const double ws = comm.size() > 1 ? double(b->cg.work->bytes()) : 0.0;
  return {double(host_memory_stats().live - before) - ws, ws};
}

// 5. The whole step of the blocks (forward and backward of every layer, not the
// attention alone): wall seconds per step on the slowest rank, and on the rank
// that waited most for the ring's blocks, its step against the same step
// without those waits (the compute-only time of the same split: the
// transfers free). Goal: <= 1.1 (the ring hidden behind the step's arithmetic).
struct WholeStep {
  double wall = 0, wait = 0, wait_rank_wall = 0;
};
WholeStep whole_step(const Communicator& comm, std::int64_t N, std::int64_t T, std::int64_t D, std::int64_t H,
                     int depth, int reps) {
  auto stats = std::make_shared<RingStats>();
  const auto b = build_blocks(comm, T, D, H, depth, ContextMode::ring, stats);
  const Tensor ids = token_ids(N, T);
  std::vector<CtxPtr> ctx;
  for (auto& l : b->layers) ctx.push_back(l->make_ctx());
  Tensor dy;
  auto step = [&] {
    Tensor x = ids;
    for (std::size_t i = 0; i < b->layers.size(); ++i) x = b->layers[i]->forward(x, *ctx[i], Call(Mode::train));
    if (!dy.defined()) dy = random(x.shape(), 3);
    Tensor g = dy;
    for (std::size_t i = b->layers.size(); i-- > 0;)
      g = b->layers[i]->backward(g, *ctx[i], i > 0, true);  // gradients accumulate: timing only
  };
  step();  // warm-up: buffers and primitives
  b->arena.zero_grads();
  stats->reset();
  MPI_Barrier(comm.handle("bench"));
  double mine = 0;
  for (int r = 0; r < reps; ++r) {
    const double t0 = MPI_Wtime();
    step();
    mine += MPI_Wtime() - t0;
  }
  double wall = mine;
  MPI_Allreduce(MPI_IN_PLACE, &wall, 1, MPI_DOUBLE, MPI_MAX, comm.handle("bench"));
  struct {
    double wait;
    int rank;
  } w{stats->wait_s, comm.rank()};
  MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_DOUBLE_INT, MPI_MAXLOC, comm.handle("bench"));
  MPI_Bcast(&mine, 1, MPI_DOUBLE, w.rank, comm.handle("bench"));
  return {wall / reps, w.wait / reps, mine / reps};
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  CLI::App app{"ring attention over a context group of all ranks"};
  std::int64_t N = 1, T = 4096, H = 4, hd = 32;
  int reps = 3, depth = 4;
  app.add_option("--batch", N, "samples");
  app.add_option("--tokens", T, "tokens per sample (the whole sequence)");
  app.add_option("--heads", H, "attention heads");
  app.add_option("--head-dim", hd, "width per head");
  app.add_option("--reps", reps, "forward + backward passes timed");
  app.add_option("--depth", depth, "transformer blocks of the activation measurement");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    MPI_Finalize();
    return app.exit(e);
  }
  omp_set_num_threads(1);
  int code = 0;
  {
    Communicator world = Communicator::world();
    const int P = world.size(), r = world.rank();
    if (P < 2) {
      if (r == 0) std::printf("parallel_context: run at 2 or more ranks (mpirun -np P)\n");
    } else {
      const Ring ht = run_ring(world, N, T, H, hd, reps, false);
      const Ring ct = run_ring(world, N, T, H, hd, reps, true);
      const ContextGroup g = ContextGroup::of(world, T);
      const double d = double(H * hd), Tp = double(2 * P * g.chunk());
      const double bound = 4.0 * 2.0 * double(N) * Tp * d * double(P - 1) / double(P);
      Communicator self = world.split(r, 0, "self");
      const double a1 = activation_bytes(self, N, T, H * hd, H, depth).kept;
      const Activations aP = activation_bytes(world, N, T, H * hd, H, depth);
      double aPmax = aP.kept;
      MPI_Allreduce(MPI_IN_PLACE, &aPmax, 1, MPI_DOUBLE, MPI_MAX, world.handle("bench"));
      // All-to-all, where P divides the heads (the mode's precondition).
      const bool a2a = H % P == 0;
      const Ring u = a2a ? run_ring(world, N, T, H, hd, reps, false, ContextMode::alltoall) : Ring{};
      const Activations aU = a2a ? activation_bytes(world, N, T, H * hd, H, depth, ContextMode::alltoall)
                                 : Activations{};
      double aUmax = aU.kept;
      const WholeStep ws = whole_step(world, N, T, H * hd, H, depth, reps);
      MPI_Allreduce(MPI_IN_PLACE, &aUmax, 1, MPI_DOUBLE, MPI_MAX, world.handle("bench"));
      const double a2a_formula = 4.0 * 4.0 * double(N) * Tp * d * double(P - 1) / (double(P) * double(P));
      if (r == 0) {
        std::printf("context parallelism: P = %d ranks, N = %lld, T = %lld (padded %lld), heads %lld x %lld, %d reps, "
                    "1 OpenMP thread per rank\n", P, (long long)N, (long long)T, (long long)Tp, (long long)H,
                    (long long)hd, reps);
        std::printf("attention arithmetic per rank (fwd+bwd, thread CPU s): head-tail max %.4f min %.4f max/min %.3f "
                    "(goal <= 1.05)\n", ht.cpu_max, ht.cpu_min, ht.cpu_max / ht.cpu_min);
        std::printf("attention arithmetic per rank (fwd+bwd, thread CPU s): contiguous max %.4f min %.4f max/min %.3f "
                    "(causal work of rank r ~ r + 1/2 blocks: 2P-1 = %d)\n",
                    ct.cpu_max, ct.cpu_min, ct.cpu_max / ct.cpu_min, 2 * P - 1);
        std::printf("ring (head-tail), the rank that waited most: arithmetic %.4f s, waiting for blocks after it %.4f s "
                    "per pass: wait/arithmetic %.3f (goal <= 0.1: the transfers hidden behind the arithmetic)\n",
                    ht.compute, ht.wait, ht.wait / ht.compute);
        std::printf("forward bytes sent per rank per layer: %.0f, formula 4 B x 2·N·T·d·(P-1)/P = %.0f, ratio %.4f "
                    "(goal within 5%%)\n", ht.fwd_bytes, bound, ht.fwd_bytes / bound);
        std::printf("activation bytes kept for the backward (embedding + %d causal blocks) per rank: context %d max "
                    "%.0f, context 1 %.0f, ratio %.4f vs 1/P = %.4f (goal <= 1.1/P = %.4f)\n", depth, P, aPmax, a1,
                    aPmax / a1, 1.0 / P, 1.1 / P);
        std::printf("ring workspace (one per context group, every layer's; live within a call): %.0f bytes = %.3f of "
                    "the kept activations at context %d\n", aP.workspace, aP.workspace / aPmax, P);
        std::printf("whole step (embedding + %d causal blocks, forward + backward, ring): %.4f s per step (slowest "
                    "rank); the rank that waited most for blocks: step %.4f s, waits %.4f s, step / (step - waits) = "
                    "%.3f (goal <= 1.1: the step against the compute-only time of the same split)\n", depth, ws.wall,
                    ws.wait_rank_wall, ws.wait, ws.wait_rank_wall / (ws.wait_rank_wall - ws.wait));
        if (!a2a) {
          std::printf("all-to-all (parallel.context_mode = alltoall): not run, %lld heads are not divisible by P = %d\n",
                      (long long)H, P);
        } else {
          std::printf("all-to-all attention arithmetic per rank (fwd+bwd, thread CPU s): max %.4f min %.4f max/min "
                      "%.3f (every rank: the whole sequence for H/P heads; goal <= 1.05)\n", u.cpu_max, u.cpu_min,
                      u.cpu_max / u.cpu_min);
          std::printf("all-to-all, the rank that waited most: arithmetic %.4f s, exchanges (its all-to-all calls) "
                      "%.4f s per pass: exchanges/arithmetic %.3f (not overlapped)\n", u.compute, u.wait,
                      u.wait / u.compute);
          std::printf("all-to-all forward bytes sent per rank per layer: %.0f, formula 4 B x 4·N·T·d·(P-1)/P² = %.0f, "
                      "ratio %.4f (goal within 5%%); all-to-all/ring %.4f vs 2/P = %.4f\n", u.fwd_bytes, a2a_formula,
                      u.fwd_bytes / a2a_formula, u.fwd_bytes / ht.fwd_bytes, 2.0 / P);
          std::printf("all-to-all backward bytes sent per rank per layer: %.0f, formula (dO and dQKV) 4 B x "
                      "4·N·T·d·(P-1)/P² = %.0f, ratio %.4f (the layer's own forward just before it: q/k/v and the "
                      "output not gathered again; after another layer's forward, twice this)\n", u.bwd_bytes,
                      a2a_formula, u.bwd_bytes / a2a_formula);
          std::printf("per-rank attention wall time (fwd+bwd per pass, slowest rank): ring %.4f s, all-to-all %.4f s, "
                      "all-to-all/ring %.3f\n", ht.wall, u.wall, u.wall / ht.wall);
          std::printf("activation bytes kept for the backward, all-to-all: context %d max %.0f, ratio %.4f vs context "
                      "1 (goal <= 1.1/P = %.4f; the gathered q/k/v and output are the group's, gathered again by "
                      "the backward); workspace %.0f bytes\n", P, aUmax, aUmax / a1, 1.1 / P, aU.workspace);
        }
      }
    }
  }
  MPI_Finalize();
  return code;
}
