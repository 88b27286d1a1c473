// The `ringtrain` command's exit statuses, from real jobs: CLI errors exit 2 on
// every rank with one message; the later of --set and a shortcut wins; SIGUSR1
// (forwarded by mpirun) stops with 75 after a checkpoint that `--resume auto`
// continues; a second signal exits at once with 128 + signo; checkpoints cross
// trainer paths, and one of another model exits 2.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>

#include "jobs.hpp"
#include "ringtrain/train/exit_codes.hpp"
#include "ringtrain/train/signals.hpp"

using namespace ringtrain;
using namespace ringtrain::test_jobs;

namespace {

class CliJobs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("rt-clijobs-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string prepared() {
    std::string d = (dir_ / "cli-data").string();
    if (!fs::exists(d)) {
      JobResult r = run_job(ringtrain_exe() + " prepare --dataset synthetic --channels 1 --height 28 --width 28 "
                            "--samples 512 --test-samples 64 --out " + d);
      EXPECT_EQ(r.status, 0) << r.out;
    }
    return d;
  }
  fs::path dir_;
};

}  // namespace

TEST_F(CliJobs, CliErrorsExitTwoOnEveryRankWithOneMessage) {
  const std::string data = prepared();
  const std::string train = ringtrain_exe() + " train --train-data " + data + " --test-data " + data + " --threads 1 ";
  JobResult r = run_job(mpirun(2) + train + "--set data.batch_size=0");
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;
  EXPECT_EQ(count(r.out, "data.batch_size"), 1u) << "one message for the job\n" << r.out;

  r = run_job(mpirun(2) + train + "--no-such-flag");
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;

  r = run_job(mpirun(2) + train + "--checkpoint-dir /proc/self/rt-no/ckpt");
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;
  EXPECT_EQ(count(r.out, "checkpoint.dir = "), 1u) << "one message, no misleading second one\n" << r.out;

  r = run_job(mpirun(2) + ringtrain_exe() + " train --train-data " + data + "/missing --threads 1");
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;
  EXPECT_NE(r.out.find("data.train"), std::string::npos) << r.out;
}

TEST_F(CliJobs, LaterOfSetAndShortcutWins) {
  JobResult r = run_job(ringtrain_exe() + " train --print-config --epochs 3 --set train.epochs=5");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("epochs = 5"), std::string::npos) << r.out;
  r = run_job(ringtrain_exe() + " train --print-config --set train.epochs=5 --epochs 3 --batch-size 8 "
              "--set data.batch_size=12 --lr 0.5");
  EXPECT_NE(r.out.find("epochs = 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("batch_size = 12"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lr = 0.5"), std::string::npos) << r.out;
}

TEST_F(CliJobs, SignalStopsWithSeventyFiveAndResumeAutoContinues) {
  const std::string data = prepared(), ck = (dir_ / "ckpt").string();
  const std::string train = ringtrain_exe() + " train --train-data " + data + " --test-data " + data +
                            " --threads 1 --batch-size 16 --epochs 400 --no-eval --log-format plain --checkpoint-dir " +
                            ck + " ";
  // mpirun forwards SIGUSR1 to every rank (as Slurm's --signal does to a step).
  // Sent once the first epoch's checkpoint is written (training is under way), so the
  // signal lands mid-epoch whatever the machine's load.
  const std::string log = (dir_ / "job.log").string();
  JobResult r = run_job("sh -c '" + mpirun(2) + train + " > " + log + " 2>&1 & p=$!; "
                        "for i in $(seq 1200); do grep -q \"checkpoint written\" " + log + " && break; sleep 0.1; done; "
                        "kill -USR1 $p; wait $p; rc=$?; cat " + log + "; exit $rc'");
  EXPECT_EQ(r.status, exit_code::stopped) << r.out;
  EXPECT_NE(r.out.find("stopped by SIGUSR1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--resume"), std::string::npos) << r.out;
  r = run_job(mpirun(2) + train + "--resume auto --max-steps 1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("loaded checkpoint"), std::string::npos) << r.out;
}

// One checkpoint format for both trainer paths: a pipeline-2 checkpoint resumes
// on the data-parallel path at the same global batch (saying the layout changed);
// a checkpoint of another model is bad input (exit 2), one message naming the tensor.
TEST_F(CliJobs, CheckpointsCrossLayoutsAndAnotherModelExitsTwo) {
  const std::string data = prepared(), ck = (dir_ / "ckpt-layout").string();
  const std::string train = ringtrain_exe() + " train --train-data " + data + " --test-data " + data +
                            " --threads 1 --epochs 2 --no-eval --log-format plain --set model.name=mlp "
                            "--checkpoint-dir " + ck + " ";
  JobResult r = run_job(mpirun(2) + train + "--batch-size 16 --set parallel.pipeline=2 --max-steps 3");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run_job(mpirun(2) + train + "--batch-size 8 --max-steps 5 --resume " + ck);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("checkpoint written at pipeline 2 x tensor 1 x data 1 (2 ranks), continuing at pipeline 1 x "
                       "tensor 1 x data 2 (2 ranks)"), std::string::npos) << r.out;
  r = run_job(mpirun(2) + train + "--batch-size 16 --set parallel.pipeline=2 --set model.name=cnn --resume " + ck);
  EXPECT_EQ(r.status, exit_code::bad_input) << r.out;
  EXPECT_EQ(count(r.out, "has no tensor 'param/conv"), 1u) << "one message for the job\n" << r.out;
}

// `eval --checkpoint DIR` names the file it chose (the newest intact one), its
// run and position, next to the result.
TEST_F(CliJobs, EvalSaysWhichCheckpointItRead) {
  const std::string data = prepared(), ck = (dir_ / "ckpt-eval").string();
  JobResult r = run_job(ringtrain_exe() + " train --train-data " + data + " --test-data " + data +
                        " --threads 1 --epochs 1 --batch-size 16 --no-eval --log-format plain --set model.name=mlp "
                        "--checkpoint-dir " + ck);
  ASSERT_EQ(r.status, 0) << r.out;
  r = run_job(ringtrain_exe() + " eval --checkpoint " + ck + " --data " + data +
              " --set data.train=" + data + " --set model.name=mlp --set train.threads=1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("eval " + ck + "/ckpt-"), std::string::npos) << "the file, not only the directory\n" << r.out;
  EXPECT_NE(r.out.find(".h5 (run "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("global step 32, 1 epoch(s) done) on " + data), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(64 samples)"), std::string::npos) << r.out;
}

TEST(Signals, SecondSignalExitsAtOnce) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    StopSignals::install();
    std::raise(SIGUSR1);
    if (StopSignals::pending() != SIGUSR1) ::_exit(1);
    std::raise(SIGUSR1);  // the same stop delivered twice at once: ignored
    if (StopSignals::pending() != SIGUSR1) ::_exit(3);
    ::sleep(3);
    std::raise(SIGTERM);  // a second stop: _exit(128 + SIGTERM) in the handler
    ::_exit(2);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 128 + SIGTERM);
}
