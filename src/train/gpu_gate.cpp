#include "ringtrain/train/gpu_gate.hpp"

#include "ringtrain/core/error.hpp"

namespace ringtrain {
namespace {

// The first GPU session (docs/gpu.md, docs/data/gpu/): one H100, tests and jobs at 1-4 ranks.
constexpr const char* kH100Date = "2026-11-24";
constexpr const char* kH100 = "NVIDIA H100 80GB HBM3";
// The second (docs/data/gpu/9-*, 10-*) and later ones (18-*, 19-*): one H200, every GPU test at 1-4 ranks.
constexpr const char* kH200Date = "2026-11-28";
constexpr const char* kH200 = "NVIDIA H200";

bool on_list(const std::string& feature, const std::vector<std::string>& trial = {}) {
  for (const GpuVerified& v : gpu_verified())
    if (v.feature == feature) return true;
  for (const std::string& t : trial)
    if (t == feature) return true;
  return false;
}

}  // namespace

const std::vector<GpuVerified>& gpu_verified() {
  static const std::vector<GpuVerified> list = {
      {"data parallelism", kH100Date, kH100,
       "test_gpu_mpi_trainer, test_gpu_mpi_engine np1-np4; jobs/fashion_cnn.toml at 1 and 2 ranks"},
      {"device all-reduce (comm.algorithm auto, ring, tree, mpi)", kH100Date, kH100,
       "test_gpu_mpi_collectives np1-np4, bench_gpu_allreduce"},
      {"model mlp", kH100Date, kH100, "test_gpu_transformer, test_gpu_backend"},
      {"model cnn", kH100Date, kH100, "test_gpu_train_cnn, test_gpu_mpi_trainer, bench_gpu_train_step"},
      {"model resnet", kH100Date, kH100, "test_gpu_backend, bench_gpu_train_step"},
      {"model vit", kH100Date, kH100, "test_gpu_transformer (a whole vit step), bench_gpu_train_step"},
      {"fp32 arithmetic", kH100Date, kH100, "test_gpu_mpi_trainer, bench_gpu_train_step"},
      {"tf32 arithmetic", kH100Date, kH100, "bench_gpu_train_step (cnn, resnet, vit)"},
      {"bf16 arithmetic (float32 storage)", kH100Date, kH100,
       "test_gpu_mpi_trainer (cnn), GpuTrainer.RepeatedRunsAreBitwiseIdentical, bench_gpu_train_step"},
      {"fp16 arithmetic with loss scaling (float32 storage)", kH100Date, kH100,
       "test_gpu_mpi_trainer (cnn), bench_gpu_train_step"},
      {"optimizers sgd, adam, adamw, lamb", kH100Date, kH100, "test_gpu_optim"},
      {"pipeline parallelism", kH200Date, kH200,
       "GpuTrainer.PipelineTrialFollowsTheCpuRun (test_gpu_mpi_trainer np2: pipeline 2, np4: data 2 x pipeline 2)"},
      {"bf16 activation storage", kH200Date, kH200, "test_gpu_mpi_bf16_vit np1-np4, bench_gpu_train_step (vit)"},
      {"fp16 activation storage", kH200Date, kH200, "test_gpu_mpi_fp16_vit np1-np4, bench_gpu_train_step (vit)"},
      {"model gpt", kH200Date, kH200,
       "test_gpu_mpi_gpt np1-np2 (fp32, tf32, bf16 against the 1-rank CPU run), test_gpu_attention, test_gpu_language"},
      // The seventh session's check (docs/data/gpu/18-*, 19-*): each ran as a trial and passed at 1-4 ranks.
      {"tensor parallelism", kH200Date, kH200, "test_gpu_mpi_model_parallel np1-np4 (vit against the CPU run)"},
      {"sequence parallelism", kH200Date, kH200, "test_gpu_mpi_model_parallel, test_gpu_mpi_vocab_parallel np1-np4"},
      {"vocabulary parallelism", kH200Date, kH200, "test_gpu_mpi_vocab_parallel np1-np4 (gpt against the 1-rank CPU run)"},
      {"ZeRO-1", kH200Date, kH200, "test_gpu_mpi_model_parallel np2-np4 (vs data parallelism; resumed bitwise)"},
      {"ZeRO-2", kH200Date, kH200, "test_gpu_mpi_zero np2-np4 (vs data parallelism, chunked device memory)"},
      {"ZeRO-3", kH200Date, kH200, "test_gpu_mpi_zero np2-np4 (vs data parallelism, chunked device memory)"},
      {"activation recomputation (block)", kH200Date, kH200, "test_gpu_mpi_model_parallel np1-np4 (bitwise)"},
      {"context parallelism", kH200Date, kH200,
       "test_gpu_mpi_context_ring, test_gpu_mpi_context_attention np2-np4 (gpt, ring and all-to-all, fp32 and bf16)"},
      {"mixture of experts", kH200Date, kH200, "test_gpu_mpi_moe np1-np4 (ops, layer, gpt against the 1-rank CPU run)"},
      {"expert parallelism", kH200Date, kH200, "test_gpu_mpi_moe np2, np4 (gpt at expert 2, and x data 2)"},
      {"pipeline schedule zb-h1", kH200Date, kH200, "GpuTrainer.PipelineTrialFollowsTheCpuRun np2, np4"},
      {"pipeline schedule interleaved", kH200Date, kH200, "GpuTrainer.PipelineTrialFollowsTheCpuRun np2, np4"},
      {"pipeline schedule zb-v", kH200Date, kH200, "GpuTrainer.PipelineTrialFollowsTheCpuRun np2, np4"},
      {"bf16 activation storage of convolutions", kH200Date, kH200, "test_gpu_mpi_half_cnn np1-np4 (cnn, resnet)"},
      {"fp16 activation storage of convolutions", kH200Date, kH200, "test_gpu_mpi_half_cnn np1-np4 (cnn, resnet)"},
  };
  return list;
}

bool gpu_is_verified(const std::string& feature) { return on_list(feature); }

std::vector<GpuNeed> gpu_needs(const TrainConfig& cfg) {
  std::vector<GpuNeed> n;
  n.push_back({"data parallelism", "train.device = cuda"});
  const std::string& algo = cfg.comm.algorithm;
  const bool tested_algo = algo == "auto" || algo == "automatic" || algo == "ring" || algo == "tree" || algo == "mpi";
  n.push_back({tested_algo ? "device all-reduce (comm.algorithm auto, ring, tree, mpi)" : "device all-reduce " + algo,
               "comm.algorithm = " + algo});
  n.push_back({"model " + cfg.model.name, "model.name = " + cfg.model.name});
  const std::string& p = cfg.train.precision;
  n.push_back({p == "bf16"   ? "bf16 arithmetic (float32 storage)"
               : p == "fp16" ? "fp16 arithmetic with loss scaling (float32 storage)"
                             : p + " arithmetic",
               "train.precision = " + p});
  const std::string& o = cfg.optimizer.name;
  const bool tested_opt = o == "sgd" || o == "adam" || o == "adamw" || o == "lamb";
  n.push_back({tested_opt ? "optimizers sgd, adam, adamw, lamb" : "optimizer " + o, "optimizer.name = " + o});
  // Every mesh dimension in use is a feature of its own (kDims); tensor parallelism brings two more.
  const MeshShape dims = cfg.mesh_shape();
  for (int i = 0; i < kMeshDims; ++i)
    if (dim_at(i) != Dim::data && dims[dim_at(i)] > 1)
      n.push_back({kDims[i].feature, cat(kDims[i].key, " = ", dims[dim_at(i)])});
  // Pipeline parallelism ran on a GPU under 1F1B (its trial's default schedule); every other
  // schedule (a deferred W, chunks per rank, a user's table) is a feature of its own.
  if (cfg.parallel.pipeline > 1 && cfg.parallel.schedule != "1f1b")
    n.push_back({"pipeline schedule " + cfg.parallel.schedule, "parallel.schedule = " + cfg.parallel.schedule});
  if (cfg.parallel.tensor > 1) {
    if (cfg.parallel.sequence && cfg.model.name != "mlp" && cfg.model.name != "cnn" && cfg.model.name != "resnet")
      n.push_back({"sequence parallelism", cat("parallel.sequence = true with parallel.tensor = ", cfg.parallel.tensor)});
    if (cfg.model.name == "gpt")  // the split vocabulary's embedding and loss
      n.push_back({"vocabulary parallelism", cat("model.name = gpt with parallel.tensor = ", cfg.parallel.tensor)});
  }
  // Mixture of experts (nn/moe_device.cpp, kernels/moe.cu); its expert parallelism is the mesh dimension
  // above ("expert parallelism").
  if (cfg.model.experts > 0)
    n.push_back({"mixture of experts", cat("model.experts = ", cfg.model.experts)});
  if (cfg.parallel.zero > 0) n.push_back({cat("ZeRO-", cfg.parallel.zero), cat("parallel.zero = ", cfg.parallel.zero)});
  if (cfg.train.recompute != "none")
    n.push_back({"activation recomputation (" + cfg.train.recompute + ")", "train.recompute = " + cfg.train.recompute});
  return n;
}

std::vector<GpuNeed> gpu_unverified(const TrainConfig& cfg, const std::vector<std::string>& trial) {
  std::vector<GpuNeed> out;
  for (GpuNeed& n : gpu_needs(cfg))
    if (!on_list(n.feature, trial)) out.push_back(std::move(n));
  return out;
}

std::string gpu_gate_refusal(const TrainConfig& cfg, const std::vector<std::string>& trial) {
  const std::vector<GpuNeed> missing = gpu_unverified(cfg, trial);
  if (missing.empty()) return "";
  std::string what;
  for (const GpuNeed& n : missing) what += cat(what.empty() ? "" : ", ", n.feature, " (", n.setting, ")");
  return cat("the GPU validation gate refuses ", what,
             " on CUDA: not yet run on a GPU (docs/gpu.md lists what has; `ringtrain train --print-plan` "
             "prints it). Use train.device = cpu, or a layout on the list");
}

void check_gpu_gate(const TrainConfig& cfg, const std::vector<std::string>& trial) {
  const std::string why = gpu_gate_refusal(cfg, trial);
  RT_CHECK(why.empty(), "train.device = cuda: ", why);
}

// ---- 16-bit storage of convolutions (cuda/nn/conv.cpp, bn_pool.cpp) ----
// Whether a [[model.layers]] list (residual bodies and shortcuts included) has
// a layer whose kernel is a convolution, batch norm or pooling.
static bool has_image_layers(const std::vector<LayerDesc>& layers) {
  for (const LayerDesc& d : layers)
    if (d.type == "conv" || d.type == "batchnorm" || d.type == "maxpool" || d.type == "avgpool" ||
        has_image_layers(d.layers) || has_image_layers(d.shortcut))
      return true;
  return false;
}

bool gpu_model_has_image_layers(const TrainConfig& cfg) {
  const std::string& m = cfg.model.name;
  if (m == "mlp" || m == "vit" || m == "gpt") return false;
  if (m == "layers") return has_image_layers(cfg.model.layers);
  return true;  // cnn, resnet, and a registered model (its layers are not known from the configuration)
}

std::string gpu_storage16_feature(const TrainConfig& cfg) {
  // The convolution, batch-norm and pooling kernels took 16-bit data on CUDA
  // after the rest did: a model with them needs that feature of its own.
  const char* conv = gpu_model_has_image_layers(cfg) ? " of convolutions" : "";
  if (cfg.train.precision == "bf16") return cat("bf16 activation storage", conv);
  if (cfg.train.precision == "fp16") return cat("fp16 activation storage", conv);
  return "";
}
// ---- end 16-bit storage of convolutions ----

bool gpu_storage16_allowed(const TrainConfig& cfg, const std::vector<std::string>& trial) {
  const std::string f = gpu_storage16_feature(cfg);
  return f.empty() || on_list(f, trial);
}

}  // namespace ringtrain
