// A byte-level text corpus and a small gpt configuration for the trainer tests.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include "fixtures.hpp"
#include "ringtrain/data/prepare.hpp"

namespace ringtrain::test_fixtures {

// Removes the corpus directory when a test ends (every rank done with it first).
struct GptCorpusCleanup {
  Communicator world;
  std::filesystem::path dir;
  ~GptCorpusCleanup() {
    world.barrier();
    if (world.rank() == 0) std::filesystem::remove_all(dir);
  }
};

// 300 lines of English-like text, prepared as token shards (vocabulary 256);
// returns the data directory. `tag` names the temporary directory.
inline std::string gpt_text_corpus(const Communicator& world, const std::string& tag = "gpt") {
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

// gpt, width 16, 4 heads, depth 2, sequence 16, batch 4, AdamW, 10 steps.
inline TrainConfig gpt_config(const std::string& data) {
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

}  // namespace ringtrain::test_fixtures
