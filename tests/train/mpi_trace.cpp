// log.trace_steps: the trace of a step window (core/trace.hpp, train/trace_file.hpp)
// is one Chrome-trace file that holds every rank, only the steps asked for,
// and what each rank did in them:
//  - one "step N" span per traced step on every rank, none outside the window;
//  - the schedule's forward and backward per micro-batch (named by stage and
//    micro-batch, the stage being the rank's own), the batch read and the
//    optimizer, each inside its step's span on the main thread;
//  - at more than one data-parallel rank, the engine's all-reduces on the
//    engine thread, whose bytes sum per step to the model's gradient bytes
//    (the parameter count x 4, an independent figure);
//  - at pipeline 2, the waits for the neighbour's activation or gradient.
// A window outside the run writes nothing; a bad window is refused by name on
// every rank before training.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/trace.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
using nlohmann::json;

namespace {

class Trace : public test_fixtures::SyntheticDataTest {
 protected:
  Trace() : SyntheticDataTest("trace", 512, 64) {}

  TrainConfig config(const std::string& window, int pipeline = 1) {
    TrainConfig c = test_fixtures::small_config(data_);
    c.data.batch_size = 32;
    c.train.max_steps = 5;
    c.parallel.pipeline = pipeline;
    c.log.trace_steps = window;
    c.log.trace = data_ + "/trace-" + window + "-p" + std::to_string(pipeline) + ".json";
    return c;
  }

  // Trains `c`; returns the parsed trace (null when no file was written) and the parameter count.
  json run(const TrainConfig& c, std::int64_t* params = nullptr) {
    Trainer t(c, world_, test_fixtures::quiet_hooks());
    if (params) *params = t.memory().param_count;
    t.fit();
    EXPECT_FALSE(trace::on()) << "still recording after the run";
    world_.barrier();
    if (!std::filesystem::exists(c.log.trace)) return json();
    std::ifstream f(c.log.trace);
    return json::parse(f);
  }
};

struct Span {
  std::string name, cat;
  double t0, t1;
  int tid;
};

// pid -> the complete ("X") spans of that rank.
std::map<int, std::vector<Span>> spans_by_rank(const json& trace) {
  std::map<int, std::vector<Span>> out;
  for (const json& e : trace.at("traceEvents"))
    if (e.value("ph", "") == "X")
      out[e.at("pid").get<int>()].push_back(
          {e.at("name"), e.at("cat"), e.at("ts"), e.at("ts").get<double>() + e.at("dur").get<double>(), e.at("tid")});
  return out;
}

std::map<int, std::string> thread_names(const json& trace, int pid) {
  std::map<int, std::string> out;
  for (const json& e : trace.at("traceEvents"))
    if (e.value("name", "") == "thread_name" && e.at("pid") == pid) out[e.at("tid").get<int>()] = e.at("args").at("name");
  return out;
}

}  // namespace

TEST_F(Trace, HoldsEveryRankOnlyTheWindowAndWhatEachRankDid) {
  std::int64_t params = 0;
  const json t = run(config("2-3"), &params);
  ASSERT_FALSE(t.is_null()) << "no trace file";
  EXPECT_EQ(t.at("otherData").at("ranks"), world_.size());
  const auto by_rank = spans_by_rank(t);
  ASSERT_EQ(static_cast<int>(by_rank.size()), world_.size()) << "a rank's spans are missing";
  for (const auto& [pid, spans] : by_rank) {
    const auto threads = thread_names(t, pid);
    std::map<std::string, int> steps, kinds;
    std::vector<const Span*> step_spans;
    for (const Span& s : spans) {
      if (s.cat == "step") {
        ++steps[s.name];
        step_spans.push_back(&s);
      }
      ++kinds[s.cat + ":" + s.name.substr(0, s.name.find(' '))];
    }
    EXPECT_EQ(steps, (std::map<std::string, int>{{"step 2", 1}, {"step 3", 1}})) << "rank " << pid;
    EXPECT_EQ(kinds["compute:F"], 2) << "rank " << pid << ": one forward per traced step";
    EXPECT_EQ(kinds["compute:B"], 2) << "rank " << pid;
    EXPECT_EQ(kinds["compute:optimizer"], 2) << "rank " << pid;
    EXPECT_EQ(kinds["data:read"], 2) << "rank " << pid;
    // The main thread's spans lie inside a step's span.
    for (const Span& s : spans) {
      if (s.cat == "step" || threads.at(s.tid) != "main") continue;
      bool inside = false;
      for (const Span* st : step_spans) inside = inside || (s.t0 >= st->t0 - 1 && s.t1 <= st->t1 + 1);
      EXPECT_TRUE(inside) << "rank " << pid << ": '" << s.name << "' outside every step";
    }
    if (world_.size() == 1) continue;
    // The engine's all-reduces move the whole gradient once per step: 4 bytes per parameter.
    double bytes = 0;
    int on_engine = 0;
    for (const json& e : t.at("traceEvents"))
      if (e.value("ph", "") == "X" && e.at("pid") == pid && e.at("name").get<std::string>().rfind("all-reduce", 0) == 0) {
        bytes += e.at("args").at("bytes").get<double>();
        on_engine += threads.at(e.at("tid").get<int>()) == "engine";
      }
    EXPECT_EQ(bytes, 2.0 * 4.0 * static_cast<double>(params)) << "rank " << pid << ": gradient bytes over two steps";
    EXPECT_GT(on_engine, 0) << "rank " << pid << ": no all-reduce on the engine thread";
  }
}

TEST_F(Trace, PipelineWaitsAreTracedPerStage) {
  if (world_.size() % 2 != 0) GTEST_SKIP() << "pipeline 2 needs an even rank count";
  const json t = run(config("4", 2));
  ASSERT_FALSE(t.is_null());
  for (const auto& [pid, spans] : spans_by_rank(t)) {
    // Ranks 0..dp-1 hold stage 0 (parallel/grid.hpp: the pipeline coordinate varies slowest).
    const int stage = pid / (world_.size() / 2);
    int forwards = 0, waits = 0;
    for (const Span& s : spans) {
      if (s.name.rfind("F ", 0) == 0) {
        ++forwards;
        EXPECT_EQ(s.name.substr(2, s.name.find('.') - 2), std::to_string(stage)) << "rank " << pid << ": " << s.name;
      }
      waits += s.cat == "wait" && s.name.rfind("recv ", 0) == 0;
    }
    EXPECT_EQ(forwards, 2) << "rank " << pid << ": two micro-batches";
    EXPECT_EQ(waits, 2) << "rank " << pid << ": stage " << stage << " waits for two "
                        << (stage == 0 ? "gradients" : "activations");
  }
}

TEST_F(Trace, AWindowOutsideTheRunWritesNothingAndABadOneIsRefused) {
  EXPECT_TRUE(run(config("9-10")).is_null()) << "5 steps ran: steps 9-10 never came";
  for (const char* bad : {"3-2", "x", "0-1", "2-"}) {
    int refused = 0;
    try {
      Trainer tr(config(bad), world_, test_fixtures::quiet_hooks());
    } catch (const Error& e) {
      refused = std::string(e.what()).find("log.trace_steps") != std::string::npos;
    }
    allreduce(&refused, &refused, 1, DType::i32, ReduceOp::sum, world_);
    EXPECT_EQ(refused, world_.size()) << "'" << bad << "' is not refused by name on every rank";
  }
}
