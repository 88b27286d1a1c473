// comm.autotune in a running engine: a training-like loop (gradients
// submitted one by one during a "backward", then waited for) tunes itself
// within its sample budget, every rank ends with the same setting, the log
// on rank 0 lists each sample, and every step's results stay exact.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine_test_util.hpp"

using namespace ringtrain;
using namespace rt_test;
namespace fs = std::filesystem;

namespace {
// Returns the same path on every rank (rank 0's temp name).
std::string shared_path(const char* tag) {
  char buf[256] = {0};
  if (world_rank() == 0)
    std::snprintf(buf, sizeof buf, "%s", (fs::temp_directory_path() / cat("rt_autotune_", tag, "_", getpid(), ".csv")).c_str());
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}

// min == max over ranks.
template <typename T>
bool same_on_all_ranks(T v) {
  double d[2] = {static_cast<double>(v), -static_cast<double>(v)};
  MPI_Allreduce(MPI_IN_PLACE, d, 2, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  return d[0] == -d[1];
}
}  // namespace

TEST(EngineAutotune, TunesWithinBudgetAndEveryRankChoosesTheSame) {
  if (world_size() < 2) GTEST_SKIP() << "the choice across ranks needs 2 ranks";
  auto comm = Communicator::world();
  const int rank = world_rank(), size = world_size();
  const std::string log_path = shared_path("log");
  EngineOptions eo;
  eo.autotune = {true, 8, 2, log_path};
  Engine eng(comm, eo);
  // 6 "layers" of 64 KiB-1 MiB gradients.
  const std::vector<std::int64_t> sizes{1 << 18, 1 << 14, 1 << 16, 1 << 17, 1 << 14, 1 << 15};
  std::vector<Tensor> grads;
  for (auto n : sizes) grads.push_back(Tensor::empty({n}));
  // Upper bound on the steps: 2 (learn, probe) + budget x steps per sample, and a margin.
  const int steps = 2 + 8 * 2 + 4;
  int finished_at = -1;
  for (int step = 0; step < steps; ++step) {
    std::vector<Handle> hs;
    for (std::size_t i = grads.size(); i-- > 0;) {
      fill(grads[i], [&](std::int64_t j) { return exact_value(static_cast<int>(i) + step, rank, j); });
      std::this_thread::sleep_for(std::chrono::microseconds(300));  // the layer's backward
      hs.push_back(eng.allreduce_async(cat("layer", i), grads[i], ReduceOp::sum));
    }
    for (auto& h : hs) eng.wait(h);
    // Exact: the reference sum of the same values, computed here.
    for (std::size_t i = 0; i < grads.size(); ++i)
      for (std::int64_t j = 0; j < grads[i].numel(); j += 997) {
        double want = 0;
        for (int r = 0; r < size; ++r) want += exact_value(static_cast<int>(i) + step, r, j);
        ASSERT_EQ(get(grads[i], j), want) << "step " << step << " tensor " << i << " element " << j;
      }
    if (finished_at < 0 && eng.autotune_result().finished) finished_at = step;
  }
  auto r = eng.autotune_result();
  ASSERT_TRUE(r.finished) << "the search did not end within " << steps << " steps";
  EXPECT_GE(r.samples, 3);
  EXPECT_LE(r.samples, 8);
  EXPECT_TRUE(same_on_all_ranks(r.samples));
  EXPECT_TRUE(same_on_all_ranks(r.setting.fusion_threshold)) << "fusion " << r.setting.fusion_threshold;
  EXPECT_TRUE(same_on_all_ranks(r.setting.cycle_time_ms));
  EXPECT_TRUE(same_on_all_ranks(static_cast<int>(r.setting.small)));
  EXPECT_TRUE(same_on_all_ranks(static_cast<int>(r.setting.large)));
  EXPECT_TRUE(same_on_all_ranks(finished_at)) << "ranks finished tuning after different steps";
  // The engine runs with the choice.
  EXPECT_EQ(eng.options().fusion_threshold, r.setting.fusion_threshold);
  EXPECT_EQ(eng.options().cycle_time_ms, r.setting.cycle_time_ms);
  if (rank == 0) {
    std::ifstream in(log_path);
    ASSERT_TRUE(in) << log_path;
    std::string line;
    int rows = 0, chosen = 0;
    std::string chosen_row;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#' || line.rfind("sample,", 0) == 0) continue;
      ++rows;
      if (line.size() >= 2 && line.substr(line.size() - 2) == ",1") ++chosen, chosen_row = line;
    }
    EXPECT_EQ(rows, r.samples + 1) << "one row per sample and the choice";
    EXPECT_EQ(chosen, 1);
    // The chosen row names the setting in use: fusion threshold and algorithms.
    EXPECT_NE(chosen_row.find(cat(",", r.setting.fusion_threshold, ",")), std::string::npos) << chosen_row;
    EXPECT_NE(chosen_row.find(cat(algorithm_name(r.setting.small), ",", algorithm_name(r.setting.large))),
              std::string::npos)
        << chosen_row;
    fs::remove(log_path);
  }
}

TEST(EngineAutotune, BadLogPathIsAnErrorOnEveryRank) {
  auto comm = Communicator::world();
  EngineOptions eo;
  eo.autotune = {true, 8, 2, "/nonexistent-dir/autotune.csv"};
  try {
    Engine eng(comm, eo);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("comm.autotune_log"), std::string::npos) << e.what();
  }
}

TEST(EngineAutotune, RanksWithDifferentAutotuneSettingsAreRejected) {
  if (world_size() < 2) GTEST_SKIP() << "a disagreement needs 2 ranks";
  auto comm = Communicator::world();
  EngineOptions eo;
  eo.autotune.enabled = world_rank() == 1;
  try {
    Engine eng(comm, eo);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("comm.autotune"), std::string::npos) << e.what();
  }
}
