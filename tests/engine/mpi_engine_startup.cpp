// broadcast_tensors / verify_identical (start-up and debug helpers) and the
// Chrome-trace timeline (valid JSON parsed with nlohmann::json, expected events).
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "engine_test_util.hpp"

using namespace ringtrain;
using namespace rt_test;
namespace fs = std::filesystem;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A directory shared by all ranks (same host), made by rank 0.
std::string shared_tmpdir(const char* tag) {
  char buf[256] = {0};
  if (world_rank() == 0) {
    std::string d = (fs::temp_directory_path() / cat("rt_engine_", tag, "_", getpid())).string();
    fs::create_directories(d);
    std::snprintf(buf, sizeof buf, "%s", d.c_str());
  }
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}
}  // namespace

TEST(EngineStartup, BroadcastTensorsCopiesRootParameters) {
  auto comm = Communicator::world();
  int rank = world_rank(), root = world_size() - 1;
  std::vector<Tensor> ts{Tensor::empty({3, 5}), Tensor::empty({7}, DType::f64), Tensor::empty({2}, DType::i64)};
  for (std::size_t i = 0; i < ts.size(); ++i)
    fill(ts[i], [&](std::int64_t j) { return exact_value(static_cast<int>(i), rank, j); });
  std::vector<Tensor> expect;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    expect.push_back(ts[i].clone());
    fill(expect.back(), [&](std::int64_t j) { return exact_value(static_cast<int>(i), root, j); });
  }
  broadcast_tensors(ts, root, comm, test_options().collective);
  for (std::size_t i = 0; i < ts.size(); ++i) EXPECT_TRUE(same_bytes(ts[i], expect[i])) << i;
  EXPECT_NO_THROW(verify_identical(ts, comm));
}

TEST(EngineStartup, BroadcastTensorsRejectsMismatchedLayouts) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = Communicator::world();
  std::vector<Tensor> ts{Tensor::zeros({4}), Tensor::zeros({world_rank() == 1 ? 6 : 5})};
  try {
    broadcast_tensors(ts, 0, comm, test_options().collective);
    ADD_FAILURE() << "mismatched shapes must throw on every rank";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "tensor #1")) << e.what();
  }
  std::vector<Tensor> fewer(world_rank() == 1 ? 1 : 2, Tensor::zeros({4}));
  EXPECT_THROW(broadcast_tensors(fewer, 0, comm), Error);
  EXPECT_THROW(broadcast_tensors(ts, world_size(), comm), Error);
}

TEST(EngineStartup, VerifyIdenticalNamesTheFirstDifferingTensor) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = Communicator::world();
  std::vector<Tensor> ts{Tensor::zeros({100}), Tensor::zeros({50}), Tensor::zeros({50})};
  EXPECT_NO_THROW(verify_identical(ts, comm, {"a", "b", "c"}));
  if (world_rank() == 1) ts[1].data<float>()[49] = 1e-30f;  // one bit pattern differs
  if (world_rank() == 1) ts[2].data<float>()[0] = 1.0f;
  try {
    verify_identical(ts, comm, {"conv1.weight", "fc.bias", "fc.weight"});
    ADD_FAILURE() << "a differing tensor must throw on every rank";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "'fc.bias'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "rank 1:")) << e.what();
  }
}

TEST(EngineStartup, TimelineIsValidChromeTraceJson) {
  std::string dir = shared_tmpdir("timeline");
  for (bool all_ranks : {false, true}) {
    EngineOptions o = test_options();
    o.timeline = dir + "/timeline.json";
    o.timeline_all_ranks = all_ranks;
    o.fusion_threshold = 1 << 20;
    std::vector<std::string> names;
    {
      Engine eng(Communicator::world(), o);
      std::vector<Tensor> ts;
      std::vector<Handle> hs;
      for (int step = 0; step < 2; ++step) {
        for (int i = 0; i < 6; ++i) {
          if (step == 0) {
            ts.push_back(Tensor::zeros({100 * (i + 1)}));
            names.push_back(cat("layer", i, ".weight \"q\""));  // a name needing JSON escapes
          }
          hs.push_back(eng.allreduce_async(names[i], ts[i]));
        }
        for (auto& h : hs) eng.wait(h);
        hs.clear();
      }
      // A large tensor alone in its batch (reduced in place, no MEMCPY_IN).
      Tensor big = Tensor::zeros({300000});
      eng.wait(eng.allreduce_async("big", big));
    }  // the destructor closes the file
    MPI_Barrier(MPI_COMM_WORLD);
    std::string path = all_ranks ? cat(dir, "/timeline.", world_rank(), ".json") : dir + "/timeline.json";
    if (!all_ranks && world_rank() != 0) {
      EXPECT_FALSE(fs::exists(cat(dir, "/timeline.", world_rank(), ".json")));
      continue;
    }
    std::ifstream f(path);
    ASSERT_TRUE(f.good()) << path;
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(f)) << path << " is not valid JSON";
    ASSERT_TRUE(j.is_array());
    std::set<std::string> phases, rows;
    for (auto& e : j) {
      ASSERT_TRUE(e.contains("ph") && e.contains("pid"));
      EXPECT_EQ(e["pid"].get<int>(), world_rank());
      if (e["ph"] == "X") {
        phases.insert(e["name"].get<std::string>());
        EXPECT_GE(e["dur"].get<double>(), 0.0);
      }
      if (e["name"] == "thread_name") rows.insert(e["args"]["name"].get<std::string>());
    }
    for (const char* p : {"QUEUE", "NEGOTIATE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"})
      EXPECT_TRUE(phases.count(p)) << "missing " << p << " in " << path;
    for (auto& n : names) EXPECT_TRUE(rows.count(n)) << "no row for " << n;
    EXPECT_TRUE(rows.count("big"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST(EngineStartup, TimelineUnwritablePathIsAnError) {
  EngineOptions o = test_options();
  o.timeline = "/nonexistent_dir_rt/timeline.json";
  for (bool all_ranks : {true, false}) {  // only rank 0 opens one: every rank must still throw
    o.timeline_all_ranks = all_ranks;
    try {
      Engine eng(Communicator::world(), o);
      ADD_FAILURE() << "an unwritable timeline must throw on every rank";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "rank 0 could not open its timeline")) << e.what();
      EXPECT_TRUE(contains(e.what(), "/nonexistent_dir_rt/timeline")) << e.what();
    }
  }
}
