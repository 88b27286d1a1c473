// `ringtrain train --print-plan`: the resolved layout and batch split of known
// configurations (plan_run, the trainer's own rules), the command line's JSON
// and exit statuses (2 naming the key when a configuration cannot run at that
// rank count), and the refusal of environment variables that used to override
// configuration keys.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "jobs.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/train/exit_codes.hpp"
#include "ringtrain/train/plan.hpp"

using namespace ringtrain;
using namespace ringtrain::test_jobs;

namespace {

TrainConfig config(std::initializer_list<const char*> sets) {
  TrainConfig c;
  for (const char* s : sets) c.set(s);
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Plan, DefaultsAtFourRanksAreDataParallel) {
  const RunPlan p = plan_run(TrainConfig{}, 4);
  EXPECT_EQ(p.ranks, 4);
  EXPECT_EQ(p.data, 4);
  EXPECT_EQ(p.pipeline, 1);
  EXPECT_EQ(p.tensor, 1);
  EXPECT_EQ(p.batch_per_rank, 64);
  EXPECT_EQ(p.accumulation, 1);
  EXPECT_EQ(p.micro_batches, 1);
  EXPECT_EQ(p.micro_batch_size, 64);
  EXPECT_EQ(p.global_batch, 256);
  EXPECT_EQ(p.zero, 0);
}

TEST(Plan, GlobalBatchIsSplitByTheTrainersRule) {
  // 8 ranks = data 2 x pipeline 2 x tensor 2; 96 = 2 x 48, 48 split into 2 micro-batches of 24.
  RunPlan p = plan_run(config({"parallel.pipeline=2", "parallel.tensor=2", "data.global_batch=96",
                               "parallel.schedule=zb-h1", "parallel.zero=2"}),
                       8);
  EXPECT_EQ(p.data, 2);
  EXPECT_EQ(p.pipeline, 2);
  EXPECT_EQ(p.tensor, 2);
  EXPECT_EQ(p.schedule, "zb-h1");
  EXPECT_EQ(p.zero, 2);
  EXPECT_EQ(p.batch_per_rank, 48);
  EXPECT_EQ(p.accumulation, 1);
  EXPECT_EQ(p.micro_batches, 2);
  EXPECT_EQ(p.micro_batch_size, 24);
  EXPECT_EQ(p.global_batch, 96);
  // train.accumulation is a lower bound: 96 at 3 ranks with accumulation >= 2 is 3 x 2 x 16,
  // at 4 ranks 4 x 2 x 12; at 5 ranks 96 has no exact split.
  const TrainConfig acc = config({"data.global_batch=96", "train.accumulation=2"});
  p = plan_run(acc, 3);
  EXPECT_EQ(p.batch_per_rank, 16);
  EXPECT_EQ(p.accumulation, 2);
  EXPECT_EQ(p.global_batch, 96);
  p = plan_run(acc, 4);
  EXPECT_EQ(p.batch_per_rank, 12);
  EXPECT_EQ(p.global_batch, 96);
  const std::string m = error_of([&] { plan_run(acc, 5); });
  EXPECT_NE(m.find("data.global_batch = 96 has no exact split"), std::string::npos) << m;
  // Without data.global_batch the global batch follows the rank count.
  EXPECT_EQ(plan_run(config({"data.batch_size=32", "train.accumulation=3"}), 5).global_batch, 32 * 5 * 3);
}

TEST(Plan, LayoutsThatCannotRunNameTheKey) {
  std::string m = error_of([] { plan_run(config({"parallel.pipeline=2"}), 3); });
  EXPECT_NE(m.find("parallel.pipeline = 2"), std::string::npos) << m;
  EXPECT_NE(m.find("does not divide the 3 ranks"), std::string::npos) << m;
  m = error_of([] { plan_run(config({"parallel.pipeline=4", "data.batch_size=30"}), 4); });
  EXPECT_NE(m.find("data.batch_size = 30"), std::string::npos) << m;
  m = error_of([] { plan_run(TrainConfig{}, 0); });
  EXPECT_NE(m.find("--ranks"), std::string::npos) << m;
}

// Pipeline schedules: a count the chosen schedule cannot run is refused naming
// the keys; every schedule that can is predicted (unit-time play; the formulas
// are tests/parallel/schedule_test.cpp's).
TEST(Plan, PipelineSchedulesArePredictedOrRefusedByName) {
  std::string m = error_of([] {
    plan_run(config({"parallel.pipeline=2", "parallel.schedule=interleaved", "parallel.micro_batches=3",
                     "data.batch_size=30"}), 2);
  });
  EXPECT_NE(m.find("parallel.schedule = interleaved"), std::string::npos) << m;
  EXPECT_NE(m.find("must be a multiple of 2"), std::string::npos) << m;
  const RunPlan p = plan_run(config({"parallel.pipeline=2", "parallel.micro_batches=4", "parallel.schedule=zb-v"}), 2);
  std::map<std::string, RunPlan::SchedulePrediction> by;
  for (const auto& s : p.schedules) by[s.name] = s;
  ASSERT_EQ(by.size(), 5u);
  EXPECT_DOUBLE_EQ(by["1f1b"].bubble, 1.0 / 5);  // (p-1)/(m+p-1)
  EXPECT_DOUBLE_EQ(by["interleaved"].step_vs_1f1b, 27.0 / 30);  // 3vm + 3(p-1) over 3(m+p-1), in chunk units
  EXPECT_LT(by["zb-v"].step_vs_1f1b, by["zb-h1"].step_vs_1f1b);
  EXPECT_LE(by["zb-v"].peak_activations, by["1f1b"].peak_activations);
  // Every rank computes 3m units of its stage (F = I = W): 12 of 1f1b's 3(m + p - 1) = 15, any table.
  for (const auto& [name, s] : by) EXPECT_DOUBLE_EQ(s.busiest_vs_1f1b, 12.0 / 15) << name;
  EXPECT_EQ(by["zb-v"].chunks, 2);
  EXPECT_NE(p.json().find("schedules_unit_time"), std::string::npos);
  // auto is chosen at start from measured layer times: the plan lists the candidates.
  EXPECT_EQ(plan_run(config({"parallel.pipeline=2", "parallel.schedule=auto"}), 2).schedules.size(), 5u);
}

// Sequence parallelism: on for transformer blocks at tensor > 1 unless parallel.sequence = false.
TEST(Plan, SaysWhetherSequenceParallelismIsOn) {
  auto on = [](std::initializer_list<const char*> sets, int ranks) {
    return plan_run(config(sets), ranks).sequence;
  };
  EXPECT_TRUE(on({"model.name=vit", "parallel.tensor=2"}, 2));
  EXPECT_FALSE(on({"model.name=vit", "parallel.tensor=2", "parallel.sequence=false"}, 2));
  EXPECT_FALSE(on({"model.name=vit"}, 2));                         // tensor 1
  EXPECT_FALSE(on({"model.name=cnn", "parallel.tensor=2"}, 2));    // no transformer blocks
  EXPECT_TRUE(on({"model.name=gpt", "parallel.tensor=2"}, 2));     // gpt's blocks (MoE ones too)
  const auto j = nlohmann::json::parse(plan_run(config({"model.name=vit", "parallel.tensor=2"}), 4).json());
  EXPECT_EQ(j.at("layout").at("sequence"), true);
}

TEST(Plan, JsonHasEveryFieldOnce) {
  const auto j = nlohmann::json::parse(plan_run(config({"parallel.pipeline=2", "data.global_batch=64"}), 4).json());
  EXPECT_EQ(j.at("ranks"), 4);
  EXPECT_EQ(j.at("layout").at("data"), 2);
  EXPECT_EQ(j.at("layout").at("pipeline"), 2);
  EXPECT_EQ(j.at("layout").at("tensor"), 1);
  EXPECT_EQ(j.at("layout").at("schedule"), "1f1b");
  EXPECT_EQ(j.at("layout").at("zero"), 0);
  EXPECT_EQ(j.at("layout").at("sequence"), false);
  EXPECT_EQ(j.at("batch_per_rank"), 32);
  EXPECT_EQ(j.at("accumulation"), 1);
  EXPECT_EQ(j.at("micro_batches"), 2);
  EXPECT_EQ(j.at("micro_batch_size"), 16);
  EXPECT_EQ(j.at("global_batch"), 64);
  EXPECT_EQ(j.at("gpu_gate").at("on_cuda"), "allowed");  // pipeline 2 ran on an H200 (train/mpi_gpu_gate tests the gate)
  EXPECT_EQ(j.at("schedules_unit_time").size(), 5u);  // pipeline 2, m = 2: every schedule runs
  EXPECT_EQ(j.size(), 9u) << j.dump();
}

class PlanCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("rt-plancli-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // data.global_batch written as TOML writes it: an integer, read by the trainer's own parser.
    std::ofstream(dir_ / "job.toml") << "[data]\nglobal_batch = 1000\nbatch_size = 8\n[parallel]\npipeline = 2\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string train() const { return ringtrain_exe() + " train --config " + (dir_ / "job.toml").string() + " "; }
  fs::path dir_;
};

TEST_F(PlanCli, PrintsTheJsonPlanWithoutMpirun) {
  // 1000 at 10 ranks = data 5 x pipeline 2: 1000 = 5 x 1 x 200, 200 in 2 micro-batches of 100.
  JobResult r = run_job(train() + "--print-plan --ranks 10");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("layout").at("data"), 5);
  EXPECT_EQ(j.at("batch_per_rank"), 200);
  EXPECT_EQ(j.at("micro_batch_size"), 100);
  EXPECT_EQ(j.at("global_batch"), 1000);
  // --set applies before planning, as for training.
  r = run_job(train() + "--set data.global_batch=0 --print-plan --ranks 10");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("global_batch"), 8 * 5);
}

TEST_F(PlanCli, ALayoutThatCannotRunExitsTwoNamingTheKey) {
  // 6 ranks = data 3: 1000 is no multiple of 3.
  JobResult r = run_job(train() + "--print-plan --ranks 6");
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;
  EXPECT_NE(r.out.find("data.global_batch = 1000 has no exact split"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\"layout\""), std::string::npos) << "no plan printed\n" << r.out;
  r = run_job(train() + "--print-plan --ranks 5");
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;
  EXPECT_NE(r.out.find("parallel.pipeline = 2"), std::string::npos) << r.out;
  r = run_job(train() + "--ranks 4");
  EXPECT_EQ(r.status, exit_code::bad_input) << "--ranks needs --print-plan\n" << r.out;
}

// A cut the start refuses is refused by the plan too, when it can read the data:
// cnn has 5 top-level layers (conv1, conv2, flatten, fc1, fc2), so zb-v at
// pipeline 2 (4 chunks) plans, at pipeline 4 (8 chunks) does not; a balance
// list is checked against the chunks the schedule cuts.
TEST_F(PlanCli, ACutWithMoreChunksThanLayersIsRefusedByName) {
  const std::string data = (dir_ / "data").string();
  JobResult r = run_job(ringtrain_exe() + " prepare --dataset synthetic --samples 64 --test-samples 16 --channels 1 "
                        "--height 28 --width 28 --out " + data);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string job = train() + "--set model.name=cnn --set data.train=" + data + " --set data.test=" + data +
                          " --set data.global_batch=0 --set parallel.schedule=zb-v --set parallel.micro_batches=4 ";
  r = run_job(job + "--print-plan --ranks 2");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run_job(job + "--set parallel.pipeline=4 --print-plan --ranks 4");
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;
  EXPECT_NE(r.out.find("parallel.schedule = zb-v cuts the model into 8 chunks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("only 5 top-level layers"), std::string::npos) << r.out;
  r = run_job(job + "--set parallel.partition=list --set parallel.balance=[1,4] --print-plan --ranks 2");
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;
  EXPECT_NE(r.out.find("parallel.balance = [1, 4] has 2 entries for parallel.pipeline = 4 stages"),
            std::string::npos) << r.out;
  r = run_job(job + "--set parallel.partition=list --set parallel.balance=[1,1,1,2] --print-plan --ranks 2");
  EXPECT_EQ(r.status, 0) << r.out;
}

// The GPU validation gate (train/gpu_gate.hpp) in the printed plan: the job's
// LARS optimizer is refused on CUDA by name (its pipeline 2 and ZeRO-1 are on
// the list since the H200 runs); with --device cuda the plan itself is.
TEST_F(PlanCli, PrintsTheGpuGateAndRefusesWhatItDoesNotList) {
  JobResult r = run_job(train() + "--set optimizer.name=lars --set parallel.zero=1 --print-plan --ranks 10");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto gate = nlohmann::json::parse(r.out).at("gpu_gate");
  EXPECT_GE(gate.at("verified").size(), 1u) << r.out;
  EXPECT_EQ(gate.at("verified")[0].at("card"), "NVIDIA H100 80GB HBM3") << r.out;
  EXPECT_EQ(gate.at("on_cuda"), "refused") << r.out;
  ASSERT_EQ(gate.at("refused").size(), 1u) << r.out;
  EXPECT_EQ(gate.at("refused")[0].at("feature"), "optimizer lars") << r.out;
  r = run_job(train() + "--device cuda --set optimizer.name=lars --print-plan --ranks 10");
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;
  EXPECT_NE(r.out.find("GPU validation gate refuses optimizer lars (optimizer.name = lars)"), std::string::npos)
      << r.out;
  r = run_job(train() + "--device cuda --set parallel.zero=1 --print-plan --ranks 10");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("gpu_gate").at("on_cuda"), "allowed") << r.out;
}

TEST_F(PlanCli, UnderMpirunEveryRankPlansAndOnePrints) {
  JobResult r = run_job(mpirun(2) + train() + "--print-plan");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count(r.out, "\"ranks\": 2"), 1u) << r.out;
  r = run_job(mpirun(2) + train() + "--print-plan --ranks 6");
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;
  EXPECT_EQ(count(r.out, "has no exact split"), 1u) << "one message for the job\n" << r.out;
}

TEST_F(PlanCli, RemovedEnvironmentVariablesAreRefusedNamingTheirKey) {
  JobResult r = run_job("RINGTRAIN_BACKWARD_PASSES_PER_STEP=2 " + mpirun(2) + train() + "--print-plan");
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;
  EXPECT_EQ(count(r.out, "RINGTRAIN_BACKWARD_PASSES_PER_STEP='2' is no longer read"), 1u) << r.out;
  EXPECT_NE(r.out.find("train.accumulation"), std::string::npos) << r.out;
  r = run_job("RINGTRAIN_FUSION_THRESHOLD=1024 " + train() + "--print-config");
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;
  EXPECT_NE(r.out.find("comm.fusion_threshold"), std::string::npos) << r.out;
  // Still read by the CUDA backend, and refused only where it contradicts a key.
  r = run_job("RINGTRAIN_CUDNN_DETERMINISTIC=0 " + train() + "--set comm.deterministic=true --print-plan");
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;
  EXPECT_NE(r.out.find("RINGTRAIN_CUDNN_DETERMINISTIC=0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("comm.deterministic = true"), std::string::npos) << r.out;
  r = run_job("RINGTRAIN_CUDNN_DETERMINISTIC=0 " + train() + "--print-plan --ranks 2");
  EXPECT_EQ(r.status, 0) << r.out;
}

// The keys that replaced environment variables reach the run: comm.timeline_all_ranks makes
// every rank write its own timeline (it was RINGTRAIN_TIMELINE_ALL_RANKS).
TEST_F(PlanCli, TimelineAllRanksKeyReachesTheEngine) {
  const std::string data = (dir_ / "data").string();
  JobResult r = run_job(ringtrain_exe() + " prepare --dataset synthetic --channels 1 --height 8 --width 8 "
                        "--samples 128 --test-samples 16 --out " + data);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string train = ringtrain_exe() + " train --model mlp --train-data " + data + " --test-data " + data +
                            " --threads 1 --batch-size 8 --max-steps 2 --no-eval --log-format plain" +
                            " --set comm.timeline=" + (dir_ / "t.json").string();
  r = run_job(mpirun(2) + train + " --set comm.timeline_all_ranks=true --set comm.cache_capacity=0" +
              " --set comm.tree_threshold=0 --set comm.segment_bytes=4096");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir_ / "t.0.json")) << r.out;
  EXPECT_TRUE(fs::exists(dir_ / "t.1.json")) << "rank 1's own timeline\n" << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "t.json")) << r.out;
  fs::remove(dir_ / "t.0.json");
  fs::remove(dir_ / "t.1.json");
  r = run_job(mpirun(2) + train);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir_ / "t.json")) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "t.1.json")) << "by default only rank 0 writes one";
}
