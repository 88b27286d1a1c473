#pragma once
// The gpt trainer tests' corpus and configuration: a byte-level text corpus
// (vocabulary 256) prepared into a directory every rank shares, removed when
// the test ends, and a small gpt that learns it in a few steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <mpi.h>

#include "fixtures.hpp"
#include "ringtrain/data/prepare.hpp"

namespace ringtrain::test_fixtures {

// Removes the corpus directory when a test ends (every rank done with it first).
struct GptCleanup {
  Communicator world;
  std::filesystem::path dir;
  ~GptCleanup() {
    world.barrier();
    if (world.rank() == 0) std::filesystem::remove_all(dir);
  }
};

// Collective: the prepared token data's directory (its parent holds the text).
inline std::string gpt_text_corpus(const Communicator& world, const std::string& tag) {
  const auto dir = shared_temp_dir(world, tag);
  if (world.rank() == 0) {
    std::filesystem::create_directories(dir);
    std::ofstream f(dir / "corpus.txt");
    for (int i = 0; i < 300; ++i) f << "the quick brown fox " << i % 7 << " jumps over the lazy dog.\n";
  }
  world.barrier();
  data::TokenPrepareOptions o;
  o.input = (dir / "corpus.txt").string();
  o.output = (dir / "data").string();
  data::prepare_tokens(o, world);
  return o.output;
}

inline TrainConfig gpt_test_config(const std::string& data) {
  TrainConfig c = small_config(data);
  c.model.name = "gpt";
  c.model.width = 16;
  c.model.heads = 4;
  c.model.depth = 2;
  c.model.mlp_ratio = 2.0;
  c.model.dropout = 0.1;
  c.data.seq_len = 16;
  c.data.batch_size = 4;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 3e-3;
  c.optimizer.weight_decay = 0.1;
  c.schedule.name = "constant";
  c.train.max_steps = 10;
  return c;
}

// Every step's loss within tol of the reference run's; prints the largest difference (rank 0).
// Not collective: rank 0 may call it alone.
inline void expect_losses_follow(const std::vector<double>& got, const std::vector<double>& ref,
                                 const std::string& what, double tol) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], ref[i], tol) << what << " step " << i;
    worst = std::max(worst, std::fabs(got[i] - ref[i]));
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::printf("[gpt layouts] %s: max |loss - 1-rank loss| %.2e (tolerance %.0e)\n", what.c_str(), worst, tol);
}

}  // namespace ringtrain::test_fixtures
