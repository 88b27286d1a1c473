// The GPU validation gate (train/gpu_gate.hpp), checked without a GPU: the
// list's entries are dated and carded; a CUDA job that needs a feature not on
// it is refused naming the feature and its key, on every rank, before any rank
// waits (a rank that waited would hang this test, not fail it quietly); the
// verified jobs pass; ModelConfig::storage16 = false keeps float32
// activations (the fallback for a precision whose 16-bit storage is not on the
// list: none since the H200 ran the convolutions'); --print-plan carries the
// list and its verdict.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "ringtrain/train/gpu_gate.hpp"
#include "ringtrain/train/plan.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;

namespace {

TrainConfig cuda_job(std::initializer_list<const char*> sets) {
  TrainConfig c;
  c.train.device = "cuda";
  c.data.train = "/nonexistent/gate";  // the gate must refuse before the trainer opens anything
  c.data.test = c.data.train;
  for (const char* s : sets) c.set(s);
  return c;
}

// The trainer's error on this rank ("" if it constructed).
std::string trainer_error(const TrainConfig& c, const Communicator& world) {
  TrainerHooks hooks;
  hooks.evaluate = false;
  hooks.report = false;
  try {
    Trainer t(c, world, hooks);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Ranks whose message contains `part`, summed over the world.
int ranks_saying(const std::string& msg, const std::string& part, const Communicator& world) {
  int n = msg.find(part) != std::string::npos ? 1 : 0;
  allreduce(&n, &n, 1, DType::i32, ReduceOp::sum, world);
  return n;
}

}  // namespace

TEST(GpuGate, EveryEntryNamesItsDateCardAndEvidence) {
  const std::regex date(R"(20[0-9]{2}-[01][0-9]-[0-3][0-9])");
  ASSERT_FALSE(gpu_verified().empty());
  for (const GpuVerified& v : gpu_verified()) {
    EXPECT_FALSE(v.feature.empty());
    EXPECT_TRUE(std::regex_match(v.date, date)) << v.feature << ": date '" << v.date << "'";
    EXPECT_NE(v.card.find("NVIDIA"), std::string::npos) << v.feature << ": card '" << v.card << "'";
    EXPECT_FALSE(v.evidence.empty()) << v.feature;
  }
  // What ran on the H100 on 2026-11-24 and the H200 on 2026-11-28 (docs/data/gpu/), and what did not.
  for (const char* f : {"data parallelism", "model cnn", "model resnet", "model vit", "model mlp", "fp32 arithmetic",
                        "bf16 arithmetic (float32 storage)", "pipeline parallelism", "bf16 activation storage",
                        "fp16 activation storage", "model gpt"})
    EXPECT_TRUE(gpu_is_verified(f)) << f;
  for (const char* f : {"tensor parallelism", "ZeRO-1", "ZeRO-3", "context parallelism", "mixture of experts",
                        "expert parallelism", "pipeline schedule zb-v", "bf16 activation storage of convolutions"})
    EXPECT_TRUE(gpu_is_verified(f)) << f;
  for (const char* f : {"model layers", "optimizer lars", "activation recomputation (attention)",
                        "pipeline schedule afab"})
    EXPECT_FALSE(gpu_is_verified(f)) << f;
}

// docs/gpu.md shows the same list, row for row.
TEST(GpuGate, DocsListEveryEntry) {
  const char* root = std::getenv("RINGTRAIN_SOURCE_DIR");
  if (!root) GTEST_SKIP() << "RINGTRAIN_SOURCE_DIR not set";
  std::ifstream f(std::string(root) + "/docs/gpu.md");
  ASSERT_TRUE(f) << "docs/gpu.md";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  for (const GpuVerified& v : gpu_verified()) {
    const std::string row = "| " + v.feature + " | " + v.date + " | " + v.card + " | " + v.evidence + " |";
    EXPECT_NE(doc.find(row), std::string::npos) << "docs/gpu.md lacks the row\n" << row;
  }
  // The table's rows: from its header to the first blank line, less the separator.
  const std::size_t head = doc.find("| feature | date | card | evidence |");
  ASSERT_NE(head, std::string::npos) << "docs/gpu.md has no gate table";
  const std::string table = doc.substr(head, doc.find("\n\n", head) - head);
  const std::size_t rows = static_cast<std::size_t>(std::count(table.begin(), table.end(), '\n')) - 1;
  EXPECT_EQ(rows, gpu_verified().size()) << "docs/gpu.md lists dated features the code does not";
}

TEST(GpuGate, RefusesUnverifiedFeaturesByNameOnEveryRank) {
  Communicator world = Communicator::world();
  const int all = world.size();
  struct Case {
    TrainConfig cfg;
    std::string names;
  };
  const Case cases[] = {
      {cuda_job({"train.recompute=attention", "model.name=vit"}),
       "activation recomputation (attention) (train.recompute = attention)"},
      {cuda_job({"optimizer.name=lars"}), "optimizer lars (optimizer.name = lars)"},
      {cuda_job({"comm.algorithm=shm"}), "device all-reduce shm (comm.algorithm = shm)"},
      {cuda_job({"comm.algorithm=hierarchical"}), "device all-reduce hierarchical (comm.algorithm = hierarchical)"},
      {cuda_job({"parallel.pipeline=2", "parallel.schedule=afab"}), "pipeline schedule afab (parallel.schedule = afab)"},
  };
  for (const Case& k : cases) {
    const std::string msg = trainer_error(k.cfg, world);
    EXPECT_EQ(ranks_saying(msg, "GPU validation gate", world), all) << "rank " << world.rank() << ": " << msg;
    EXPECT_EQ(ranks_saying(msg, k.names, world), all) << "rank " << world.rank() << ": " << msg;
    EXPECT_NE(msg.find("train.device = cuda"), std::string::npos) << msg;
  }
  // Two unverified features are both named in one refusal.
  const std::string both = trainer_error(cuda_job({"optimizer.name=lars", "comm.algorithm=shm"}), world);
  EXPECT_NE(both.find("optimizer lars"), std::string::npos) << both;
  EXPECT_NE(both.find("device all-reduce shm"), std::string::npos) << both;
}

TEST(GpuGate, VerifiedJobsPassAndSixteenBitStorageIsVerified) {
  EXPECT_EQ(gpu_gate_refusal(cuda_job({})), "");
  for (const char* p : {"train.precision=fp32", "train.precision=tf32", "train.precision=bf16", "train.precision=fp16"})
    for (const char* m : {"model.name=mlp", "model.name=cnn", "model.name=resnet", "model.name=vit"})
      EXPECT_EQ(gpu_gate_refusal(cuda_job({p, m, "optimizer.name=adamw", "comm.deterministic=true"})), "") << p << " " << m;
  EXPECT_EQ(gpu_gate_refusal(cuda_job({"parallel.pipeline=2", "model.name=vit", "train.precision=bf16"})), "");
  // 16-bit activation storage ran on the H200: a vit in bf16 or fp16 keeps it on CUDA.
  EXPECT_TRUE(gpu_storage16_allowed(cuda_job({"model.name=vit", "train.precision=bf16"})));
  EXPECT_EQ(gpu_storage16_feature(cuda_job({"model.name=vit", "train.precision=fp16"})), "fp16 activation storage");
  EXPECT_TRUE(gpu_storage16_allowed(cuda_job({"model.name=vit", "train.precision=fp16"})));
  EXPECT_TRUE(gpu_storage16_allowed(cuda_job({"train.precision=tf32"})));
  // Every schedule is a feature of its own: 1F1B, ZB-H1, interleaved and ZB-V ran on the H200, AFAB did not.
  for (const char* s : {"zb-h1", "interleaved", "zb-v"})
    EXPECT_EQ(gpu_gate_refusal(cuda_job({"parallel.pipeline=2", "model.name=vit", cat("parallel.schedule=", s).c_str()})), "")
        << s;
  const TrainConfig afab = cuda_job({"parallel.pipeline=2", "parallel.schedule=afab"});
  EXPECT_NE(gpu_gate_refusal(afab).find("pipeline schedule afab (parallel.schedule = afab)"), std::string::npos)
      << gpu_gate_refusal(afab);
  EXPECT_EQ(gpu_gate_refusal(afab, {"pipeline schedule afab"}), "");
  // Every parallelism of the mesh at once, with experts, ZeRO and recomputation, is on the list.
  EXPECT_EQ(gpu_gate_refusal(cuda_job({"model.name=gpt", "model.experts=4", "parallel.tensor=2", "parallel.context=2",
                                       "parallel.expert=2", "parallel.zero=1", "train.recompute=block"})),
            "");
  // A GPU test's trial lets exactly the named features through.
  const TrainConfig two = cuda_job({"optimizer.name=lars", "comm.algorithm=shm"});
  EXPECT_EQ(gpu_gate_refusal(two, {"optimizer lars", "device all-reduce shm"}), "");
  EXPECT_NE(gpu_gate_refusal(two, {"optimizer lars"}).find("device all-reduce shm"), std::string::npos);
}

// ---- 16-bit storage of convolutions ----
// The convolution, batch-norm and pooling kernels' 16-bit storage on CUDA is a
// feature of its own (the vit's storage does not stand for it); it ran on the
// H200 and is on the list, so a cnn or resnet job in bf16/fp16 stores 16-bit
// activations on CUDA.
TEST(GpuGate, SixteenBitStorageOfConvolutionsIsItsOwnFeature) {
  for (const char* m : {"model.name=cnn", "model.name=resnet"}) {
    const TrainConfig b = cuda_job({m, "train.precision=bf16"}), f = cuda_job({m, "train.precision=fp16"});
    EXPECT_TRUE(gpu_model_has_image_layers(b)) << m;
    EXPECT_EQ(gpu_storage16_feature(b), "bf16 activation storage of convolutions") << m;
    EXPECT_EQ(gpu_storage16_feature(f), "fp16 activation storage of convolutions") << m;
    EXPECT_TRUE(gpu_is_verified(gpu_storage16_feature(b))) << "ran on the H200";
    EXPECT_TRUE(gpu_is_verified(gpu_storage16_feature(f))) << "ran on the H200";
    EXPECT_TRUE(gpu_storage16_allowed(b)) << m;
    EXPECT_TRUE(gpu_storage16_allowed(f)) << m;
    EXPECT_EQ(gpu_gate_refusal(b), "") << m;
  }
  for (const char* m : {"model.name=mlp", "model.name=vit", "model.name=gpt"})
    EXPECT_FALSE(gpu_model_has_image_layers(cuda_job({m}))) << m;
  EXPECT_EQ(gpu_storage16_feature(cuda_job({"model.name=mlp", "train.precision=bf16"})), "bf16 activation storage");
  EXPECT_EQ(gpu_storage16_feature(cuda_job({"model.name=cnn", "train.precision=tf32"})), "");
  // A [[model.layers]] list: by its entries, nested residual bodies included.
  TrainConfig l = cuda_job({"model.name=layers", "train.precision=bf16"});
  l.model.layers = {LayerDesc{"linear", {{"out", std::int64_t{10}}}, {}, {}}};
  EXPECT_FALSE(gpu_model_has_image_layers(l));
  l.model.layers.push_back(LayerDesc{"residual", {}, {LayerDesc{"batchnorm", {}, {}, {}}}, {}});
  EXPECT_TRUE(gpu_model_has_image_layers(l));
  // --print-plan names no fallback: the trainer keeps 16-bit storage.
  TrainConfig c = cuda_job({"model.name=cnn", "train.precision=bf16"});
  const auto j = nlohmann::json::parse(plan_run(c, 2).json());
  EXPECT_EQ(j.at("gpu_gate").at("on_cuda"), "allowed");
  EXPECT_EQ(j.at("gpu_gate").at("storage_fallback"), "");
}
// ---- end 16-bit storage of convolutions ----

// ModelConfig::storage16 = false (what the trainer sets on CUDA) keeps float32
// activations where the backend would store bf16: checked on the CPU backend,
// which stores bf16 activations for mlp.
TEST(GpuGate, StorageFallbackKeepsFloat32Activations) {
  ModelConfig mc;
  mc.name = "mlp";
  mc.math = MathMode::bf16;
  EXPECT_EQ(Stage(mc, Device::cpu()).activation_dtype(), DType::bf16) << "the CPU stores mlp's bf16 activations";
  mc.storage16 = false;
  EXPECT_EQ(Stage(mc, Device::cpu()).activation_dtype(), DType::f32);
}

TEST(GpuGate, PlanPrintsTheListAndItsVerdict) {
  TrainConfig c = cuda_job({"parallel.tensor=2", "model.name=mlp", "train.precision=bf16", "optimizer.name=lars"});
  c.train.device = "auto";
  const auto j = nlohmann::json::parse(plan_run(c, 4).json());
  const auto& gate = j.at("gpu_gate");
  ASSERT_EQ(gate.at("verified").size(), gpu_verified().size());
  EXPECT_EQ(gate.at("verified")[0].at("feature"), gpu_verified()[0].feature);
  EXPECT_EQ(gate.at("verified")[0].at("date"), "2026-11-24");
  EXPECT_EQ(gate.at("on_cuda"), "refused");
  ASSERT_EQ(gate.at("refused").size(), 1u);
  EXPECT_EQ(gate.at("refused")[0].at("feature"), "optimizer lars");
  EXPECT_EQ(gate.at("refused")[0].at("setting"), "optimizer.name = lars");
  EXPECT_EQ(gate.at("storage_fallback"), "") << "bf16 activation storage is on the list";
  // With train.device = cuda the plan is refused as the trainer refuses it.
  c.train.device = "cuda";
  try {
    plan_run(c, 4);
    ADD_FAILURE() << "plan_run accepted optimizer lars on cuda";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer lars (optimizer.name = lars)"), std::string::npos) << e.what();
  }
  c.optimizer.name = "adamw";
  c.parallel.tensor = 1;
  c.parallel.pipeline = 2;
  const auto ok = nlohmann::json::parse(plan_run(c, 4).json());
  EXPECT_EQ(ok.at("gpu_gate").at("on_cuda"), "allowed");
  EXPECT_TRUE(ok.at("gpu_gate").at("refused").empty());
}

// A data-parallel gpt in fp32, tf32 and bf16 (what tests/gpu/mpi_gpt.cpp ran
// on the H200) passes the gate, and so does tensor 2 (tensor, sequence and
// vocabulary parallelism, tests/gpu/mpi_vocab_parallel.cpp); recomputing the
// attention alone is named.
TEST(GpuGate, GptAtDataParallelismPasses) {
  for (const char* p : {"train.precision=fp32", "train.precision=tf32", "train.precision=bf16"}) {
    EXPECT_EQ(gpu_gate_refusal(cuda_job({"model.name=gpt", "optimizer.name=adamw", p})), "") << p;
    EXPECT_EQ(gpu_gate_refusal(cuda_job({"model.name=gpt", "parallel.tensor=2", p})), "") << p;
    const std::string ra = gpu_gate_refusal(cuda_job({"model.name=gpt", "train.recompute=attention", p}));
    EXPECT_NE(ra.find("activation recomputation (attention)"), std::string::npos) << ra;
    EXPECT_EQ(ra.find("model gpt"), std::string::npos) << ra;
  }
}
