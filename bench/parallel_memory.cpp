// What one rank holds under a layout, measured on the trainer users run: peak
// RSS (getrusage), the peak of live host tensor bytes (the CPU allocator's
// counter), and the parameter, gradient and optimizer-state bytes the rank's
// grid model holds; activations and workspaces are the tensor peak minus
// those. One layout per process (peak RSS is per process); bench/parallel_memory.sh
// runs every layout and prints each figure beside its ideal (1 rank / (PP·TP),
// ZeRO-1: P + G + O/DP, ZeRO-2: P + (G + O)/DP, ZeRO-3: (P + G + O)/DP), and the
// bytes each rank sends per step through our collectives (counted by the
// primitives; use --algorithm ring: shm copies are not on a wire) beside the
// ring all-reduce's 2(N-1)/N·G (ZeRO-3: two gathers and a reduce-scatter, 3(N-1)/N·G).
//   mpirun -np 4 bench_parallel_memory --model vit --pipeline 2 --tensor 2 [--zero 0|1|2|3] [--steps 2]
//       [--sequence --patch 2]   (sequence parallelism: bench/sequence_parallel.sh)
//       [--recompute none|attention|block] [--breakdown FILE]
//   --breakdown: each rank writes FILE.<rank>, the host tensor bytes live at its peak per
//   allocating site (bench/memory_attribution.hpp; slow: a backtrace per allocation).
// Prints one CSV row per rank (rank 0 writes them all):
//   model,ranks,pipeline,tensor,zero,rank,peak_rss_mb,tensor_peak_mb,params_b,grads_b,optimizer_b,activations_b,
//   param_count,model_param_count,grads_in_flight_b,sent_per_step_b,sequence,step_s,params_in_flight_b,precision,
//   weight_copies_b,recompute,tokens
//   (step_s: the median step after the first, seconds; params_in_flight_b: ZeRO-3's gathered layers resident at once;
//   --precision bf16: weight_copies_b are the bfloat16 copies of the Linear and Conv2d weights, 2 bytes per element
//   of every 2-D or 4-D "*.weight", which activations_b includes: the activations proper are
//   activations_b - weight_copies_b)
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/comm/primitives.hpp"
#include "ringtrain/core/allocator.hpp"
#include "ringtrain/data/prepare.hpp"
#include "ringtrain/train/trainer.hpp"
#include "memory_attribution.hpp"

using namespace ringtrain;

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Communicator world = Communicator::world();
  CLI::App app{"per-rank memory of one layout"};
  std::string model = "vit", data = "/tmp/rt-bench-memory", partition = "params";
  std::string algorithm = "auto", precision = "fp32", recompute = "none", breakdown;
  int pipeline = 1, tensor = 1, steps = 2, batch = 32, zero = 0, patch = 4;
  bool header = false, sequence = false;
  app.add_option("--model", model, "vit (width 512, depth 8, 8 heads) | resnet (ResNet-20 width 16)");
  app.add_option("--pipeline", pipeline);
  app.add_option("--tensor", tensor);
  app.add_option("--zero", zero, "parallel.zero (0 to 3)");
  app.add_option("--algorithm", algorithm, "comm.algorithm (ring: every gradient byte is counted on the wire)");
  app.add_flag("--sequence", sequence, "parallel.sequence (off here: patch 4 gives 49 tokens, which 2 does not divide)");
  app.add_option("--patch", patch, "vit: model.patch (28x28 images: 4 -> 49 tokens, 2 -> 196)");
  app.add_option("--partition", partition, "parallel.partition: params balances the stages' parameters");
  app.add_option("--steps", steps);
  app.add_option("--precision", precision, "train.precision (bf16: bfloat16 activations where every layer takes them)");
  app.add_option("--batch", batch, "global batch");
  app.add_option("--recompute", recompute, "train.recompute: none | attention | block");
  app.add_option("--breakdown", breakdown, "write FILE.<rank>: bytes live at the peak per allocating site");
  app.add_option("--data", data, "synthetic 28x28 data directory (made if absent)");
  app.add_flag("--header", header, "print the CSV header first");
  CLI11_PARSE(app, argc, argv);

  if (!std::filesystem::exists(data + "/synthetic-train.h5")) {
    data::SyntheticOptions o;
    o.output = data;
    o.train_samples = 512;
    o.test_samples = 64;
    o.channels = 1;
    o.height = o.width = 28;
    data::generate_synthetic(o, world);
  }
  TrainConfig c;
  c.model.name = model;
  if (model == "vit") {
    c.model.width = 512;
    c.model.depth = 8;
    c.model.heads = 8;
    c.model.patch = patch;
  }
  c.data.train = c.data.test = data;
  c.parallel.pipeline = pipeline;
  c.parallel.tensor = tensor;
  c.parallel.zero = zero;
  c.comm.algorithm = algorithm;
  c.parallel.sequence = sequence;
  c.parallel.partition = partition;
  const int dp = world.size() / (pipeline * tensor);
  c.data.batch_size = batch / dp;
  c.train.max_steps = steps;
  c.train.precision = precision;
  c.train.recompute = recompute;
  c.train.threads = 1;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 1e-4;
  c.schedule.name = "constant";
  c.validate();
  TrainerHooks h;
  h.report = false;
  h.evaluate = false;
  // Bytes sent between the end of step 1 and the last step's: whole steps only (no start-up
  // broadcast); step times after the first (warm-up), for the median.
  std::uint64_t sent_after_1 = 0, sent_last = 0;
  std::vector<double> step_s;
  auto last = std::chrono::steady_clock::now();
  int seen = 0;
  h.on_step = [&](std::int64_t step, double) {
    (step == 1 ? sent_after_1 : sent_last) = primitives_bytes_sent();
    const auto now = std::chrono::steady_clock::now();
    if (seen++ > 0) step_s.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
  };
  TrainerMemory m;
  double copies = 0;
  std::int64_t tokens = 0;
  if (!breakdown.empty()) memory_attribution::install();
  {
    Trainer t(c, world, h);
    t.fit();
    m = t.memory();
    if (model == "vit") tokens = (28 / patch) * (28 / patch);
    if (precision == "bf16")
      for (const auto& p : t.parameters().infos())
        if ((p.shape.size() == 2 || p.shape.size() == 4) && p.name.size() > 7 && p.name.ends_with(".weight"))
          copies += 2.0 * static_cast<double>(shape_numel(p.shape));
  }
  if (!breakdown.empty()) memory_attribution::write(breakdown + "." + std::to_string(world.rank()));
  std::sort(step_s.begin(), step_s.end());
  const double median_s = step_s.empty() ? 0 : step_s[step_s.size() / 2];
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const HostMemoryStats hs = host_memory_stats();
  const double held = static_cast<double>(m.params + m.grads + m.optimizer);
  std::vector<double> mine = {static_cast<double>(ru.ru_maxrss) / 1024.0,
                              static_cast<double>(hs.peak) / (1 << 20),
                              static_cast<double>(m.params),
                              static_cast<double>(m.grads),
                              static_cast<double>(m.optimizer),
                              std::max(0.0, static_cast<double>(hs.peak) - held),
                              static_cast<double>(m.param_count),
                              static_cast<double>(m.model_param_count),
                              static_cast<double>(m.grads_in_flight),
                              steps > 1 ? static_cast<double>(sent_last - sent_after_1) / (steps - 1) : 0.0,
                              median_s,
                              static_cast<double>(m.params_in_flight),
                              copies};
  std::vector<double> all(mine.size() * world.size());
  allgather(mine.data(), mine.size(), all.data(), DType::f64, world);
  if (world.rank() == 0) {
    if (header)
      std::printf("model,ranks,pipeline,tensor,zero,rank,peak_rss_mb,tensor_peak_mb,params_b,grads_b,optimizer_b,"
                  "activations_b,param_count,model_param_count,grads_in_flight_b,sent_per_step_b,sequence,step_s,"
                  "params_in_flight_b,precision,weight_copies_b,recompute,tokens\n");
    for (int r = 0; r < world.size(); ++r) {
      const double* v = &all[mine.size() * r];
      std::printf("%s,%d,%d,%d,%d,%d,%.1f,%.1f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%d,%.4f,%.0f,%s,%.0f,%s,%lld\n",
                  model.c_str(), world.size(), pipeline, tensor, zero, r, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7],
                  v[8], v[9], sequence ? 1 : 0, v[10], v[11], precision.c_str(), v[12], recompute.c_str(),
                  static_cast<long long>(tokens));
    }
  }
  return 0;
}
