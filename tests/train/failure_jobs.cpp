// Jobs that end, with the right status and a message naming the culprit. Each
// test launches real jobs (mpirun of this binary's DISABLED_ child tests, or
// of the `ringtrain` command) and checks the exit status, the time it took and
// the output:
//  - a rank whose compute thread hangs (engine thread alive) is named by the
//    stall shutdown, a SIGSTOPped rank by the collective timeout, and either
//    job exits non-zero within seconds of the (short, configured) limits;
// (The `ringtrain` command's exit statuses: cli_jobs.cpp.)
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "fixtures.hpp"
#include "jobs.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/data/prepare.hpp"
#include "ringtrain/parallel/parts.hpp"
#include "ringtrain/train/exit_codes.hpp"
#include "ringtrain/train/signals.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
using namespace ringtrain::test_jobs;
namespace fs = std::filesystem;

namespace {

// Inside a child job: the data directory the parent made, and the CLI's error handling.
std::string child_data(const Communicator& world) {
  const char* d = std::getenv("RT_CHILD_DATA");
  std::string dir = d ? d : "/tmp/rt-child-data";
  data::SyntheticOptions o;
  o.output = dir;
  o.train_samples = 512;
  o.test_samples = 64;
  o.channels = 1;
  o.height = o.width = 28;
  o.num_classes = 10;
  data::generate_synthetic(o, world);
  return dir;
}

void run_like_cli(const TrainConfig& c, const Communicator& world, TrainerHooks hooks) {
  try {
    Trainer t(c, world, hooks);
    t.fit();
  } catch (const std::exception& e) {
    log::error(e.what());
    MPI_Abort(MPI_COMM_WORLD, exit_code::failure);
  }
}

TrainConfig child_config(const std::string& data) {
  TrainConfig c = test_fixtures::small_config(data);
  c.data.batch_size = 16;
  c.train.epochs = 50;
  c.comm.stall_warning_s = 1;
  c.comm.stall_shutdown_s = 4;
  c.comm.collective_timeout_s = 3;
  if (const char* v = std::getenv("RT_CHILD_DEFAULT_LIMITS"); v && *v == '1') {
    TrainConfig d;
    c.comm.stall_warning_s = d.comm.stall_warning_s;
    c.comm.stall_shutdown_s = d.comm.stall_shutdown_s;
    c.comm.collective_timeout_s = d.comm.collective_timeout_s;
  }
  return c;
}

}  // namespace

// ---- children (run only inside the jobs below) --------------------------------

TEST(FailureChild, DISABLED_ComputeThreadHangsOnRankOne) {
  Communicator world = Communicator::world();
  TrainConfig c = child_config(child_data(world));
  TrainerHooks h;
  h.evaluate = false;
  h.on_step = [&](std::int64_t step, double) {
    if (step == 3 && world.rank() == 1)
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // engine thread keeps cycling
  };
  run_like_cli(c, world, h);
}

TEST(FailureChild, DISABLED_RankOneIsStopped) {
  Communicator world = Communicator::world();
  TrainConfig c = child_config(child_data(world));
  c.comm.stall_shutdown_s = 0;  // only the collective timeout can see a stopped process
  TrainerHooks h;
  h.evaluate = false;
  h.on_step = [&](std::int64_t step, double) {
    if (step == 3 && world.rank() == 1) std::raise(SIGSTOP);
  };
  run_like_cli(c, world, h);
}

// A 2-stage pipeline (cnn, 4 micro-batches) whose last stage stops after step 3:
// the first stage waits for gradients that never come.
TEST(FailureChild, DISABLED_PipelineStageOneIsStopped) {
  Communicator world = Communicator::world();
  TrainConfig c = child_config(child_data(world));
  c.comm.stall_shutdown_s = 0;
  c.parallel.pipeline = 2;
  c.parallel.micro_batches = 4;
  TrainerHooks h;
  h.evaluate = false;
  h.on_step = [&](std::int64_t step, double) {
    if (step == 3 && world.rank() == 1) std::raise(SIGSTOP);
  };
  run_like_cli(c, world, h);
}

// Evaluation on a 2-stage pipeline whose first stage stops after two batches:
// the last stage waits for an activation that never comes (this hung for good
// with blocking MPI_Bcast/MPI_Recv before).
TEST(FailureChild, DISABLED_PipelineEvalStageZeroIsStopped) {
  Communicator world = Communicator::world();
  ProcessGrid grid = ProcessGrid::make(world, {2, 1}, 3.0);
  ModelConfig mc;
  mc.name = "cnn";
  GridConfig pc;
  pc.micro_batches = 2;
  pc.batch = 16;
  OptimizerConfig oc;
  ModelParts pm = build_parts(grid, mc, pc, oc);
  Tensor x = Tensor::zeros({16, 1, 28, 28}), y = Tensor::zeros({16}, DType::i32);
  for (int b = 0; b < 1000; ++b) {
    if (b == 2 && world.rank() == 0) std::raise(SIGSTOP);
    pm.executor->evaluate(*pm.stage, *pm.loss, x, y, 16);
  }
}

// ---- the jobs ------------------------------------------------------------------

class FailureJobs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("rt-failjobs-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string child(const char* name, int np, const std::string& env = "") {
    return env + " RT_CHILD_DATA=" + (dir_ / "data").string() + " " + mpirun(np) + self_exe() +
           " --gtest_also_run_disabled_tests --gtest_filter=FailureChild.DISABLED_" + name;
  }
  fs::path dir_;
};

TEST_F(FailureJobs, HungComputeThreadEndsTheJobNamingTheRank) {
  JobResult r = run_job(child("ComputeThreadHangsOnRankOne", 2));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_LT(r.seconds, 90) << "the 4 s stall shutdown did not end the job\n" << r.out;
  EXPECT_NE(r.out.find("stall shutdown"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("but not by rank 1"), std::string::npos) << r.out;
}

TEST_F(FailureJobs, StoppedRankEndsTheJobNamingTheRank) {
  JobResult r = run_job(child("RankOneIsStopped", 3));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_LT(r.seconds, 90) << "the 3 s collective timeout did not end the job\n" << r.out;
  EXPECT_NE(r.out.find("world rank 1 does not respond"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("world rank 2 does not"), std::string::npos) << "a live rank was blamed\n" << r.out;
  EXPECT_EQ(r.out.find("world rank 0 does not"), std::string::npos) << "a live rank was blamed\n" << r.out;
}

TEST_F(FailureJobs, StoppedStageEndsPipelineEvaluationNamingTheStage) {
  JobResult r = run_job(child("PipelineEvalStageZeroIsStopped", 2));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_LT(r.seconds, 60) << "the 3 s stage timeout did not end the evaluation\n" << r.out;
  EXPECT_NE(r.out.find("evaluation"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("from pipeline stage 0 (rank 0 of 'pp' (world rank 0)): world rank 0 does not respond"),
            std::string::npos)
      << r.out;
}

TEST_F(FailureJobs, StoppedPipelineStageEndsTheJobNamingTheStage) {
  JobResult r = run_job(child("PipelineStageOneIsStopped", 2));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_LT(r.seconds, 90) << "the 3 s collective timeout did not end the pipeline job\n" << r.out;
  EXPECT_NE(r.out.find("from pipeline stage 1 (rank 1 of 'pp' (world rank 1)): world rank 1 does not respond"),
            std::string::npos)
      << r.out;
}

