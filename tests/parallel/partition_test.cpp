// Stage partitioning: the cost-balanced cut is the best contiguous cut
// (checked against brute force), several chunks per rank take the cut the
// simulator plays fastest (against every cut played), uniform/list policies,
// and their errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/parallel/partition.hpp"
#include "ringtrain/parallel/simulator.hpp"
#include "ringtrain/parallel/stage.hpp"

namespace ringtrain {
namespace {

double max_stage(const std::vector<double>& c, const std::vector<int>& counts) {
  double best = 0;
  std::size_t i = 0;
  for (int n : counts) {
    double s = 0;
    for (int k = 0; k < n; ++k) s += c[i++];
    best = std::max(best, s);
  }
  return best;
}

// Calls f with every way to cut n layers into p non-empty contiguous stages.
void for_each_cut(int n, int p, const std::function<void(const std::vector<int>&)>& f) {
  std::vector<int> counts;
  std::function<void(int, int)> rec = [&](int left, int stages) {
    if (stages == 1) {
      counts.push_back(left);
      f(counts);
      counts.pop_back();
      return;
    }
    for (int k = 1; k <= left - (stages - 1); ++k) {
      counts.push_back(k);
      rec(left - k, stages - 1);
      counts.pop_back();
    }
  };
  rec(n, p);
}

double brute_force(const std::vector<double>& c, int p) {
  double best = 1e300;
  for_each_cut(static_cast<int>(c.size()), p,
               [&](const std::vector<int>& counts) { best = std::min(best, max_stage(c, counts)); });
  return best;
}

TEST(Partition, CostBalanceIsTheBestContiguousCut) {
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + trial % 9;
    std::vector<double> c(n);
    for (int i = 0; i < n; ++i) c[i] = 1 + ((trial * 7919 + i * 104729) % 97);
    for (int p = 1; p <= n; ++p) {
      std::vector<int> b = balance_by_cost(c, p);
      ASSERT_EQ(static_cast<int>(b.size()), p);
      EXPECT_EQ(std::accumulate(b.begin(), b.end(), 0), n);
      for (int x : b) EXPECT_GE(x, 1);
      EXPECT_DOUBLE_EQ(max_stage(c, b), brute_force(c, p)) << "n=" << n << " p=" << p;
    }
  }
}

// The fastest play of `table` over every cut of the layers (chunk_costs), by brute force.
double fastest_play(const std::vector<double>& c, const Schedule& table) {
  double best = 1e300;
  for_each_cut(static_cast<int>(c.size()), table.layout.stages(), [&](const std::vector<int>& counts) {
    best = std::min(best, simulate(table, chunk_costs(counts, c)).makespan);
  });
  return best;
}

TEST(Partition, SeveralChunksPerRankTakeTheCutTheSimulatorPlaysFastest) {
  for (ScheduleKind kind : {ScheduleKind::interleaved, ScheduleKind::zb_v})
    for (int trial = 0; trial < 24; ++trial) {
      const int n = 4 + trial % 5;
      std::vector<double> c(n);
      for (int i = 0; i < n; ++i) c[i] = 1 + ((trial * 7919 + i * 104729) % 97);
      const Schedule table = make_schedule(kind, 2, 4, 2);
      const std::vector<int> every = balance_by_play(c, table), local = balance_by_play(c, table, 0);
      ASSERT_EQ(static_cast<int>(every.size()), 4);
      EXPECT_EQ(std::accumulate(every.begin(), every.end(), 0), n);
      for (int x : every) EXPECT_GE(x, 1);
      const double best = fastest_play(c, table);
      const double chunk_balanced = simulate(table, chunk_costs(balance_by_cost(c, 4), c)).makespan;
      EXPECT_DOUBLE_EQ(simulate(table, chunk_costs(every, c)).makespan, best) << schedule_name(kind) << " n=" << n;
      // The local search (every_cut = 0) never loses to where it starts.
      EXPECT_LE(simulate(table, chunk_costs(local, c)).makespan, chunk_balanced) << schedule_name(kind) << " n=" << n;
    }
  // cnn's layers (conv1, conv2, flatten, fc1, fc2; forward + backward ms): the chunk-balanced cut
  // [1, 1, 1, 2] leaves rank 1 conv2 and both Linear layers (19.1 ms against rank 0's 5.3); the
  // play moves fc1 to rank 0 (17.1 against 7.3).
  const std::vector<double> cnn = {5.3, 17.0, 0.01, 2.0, 0.1};
  const Schedule interleaved = make_schedule(ScheduleKind::interleaved, 2, 4, 2);
  EXPECT_EQ(balance_by_cost(cnn, 4), (std::vector<int>{1, 1, 1, 2}));
  const std::vector<int> cut = balance_by_play(cnn, interleaved);
  const SimResult r = simulate(interleaved, chunk_costs(cut, cnn));
  EXPECT_NEAR(*std::max_element(r.busy.begin(), r.busy.end()), 4 * 17.1, 1e-9);
  EXPECT_LT(r.makespan, simulate(interleaved, chunk_costs({1, 1, 1, 2}, cnn)).makespan);
  // One chunk per rank: the chunk-balanced cut itself.
  EXPECT_EQ(balance_by_play(cnn, make_schedule(ScheduleKind::one_f_one_b, 2, 4, 1)), balance_by_cost(cnn, 2));
}

// busiest_rank_s: by hand, 1F1B at p = 2, m = 4 with stage 0 at F 2, I 0.5, W 0.5 and stage 1 at
// F 1, I 1, W 1 and a whole B of 1.5: rank 0 computes 4 x (2 + 1) = 12, rank 1 4 x (1 + 1.5) = 10.
// No table of the cut plays faster: every built-in one, split or whole, over random costs.
TEST(Partition, TheBusiestRankBoundsEveryTableOfTheCut) {
  SimCosts c;
  c.stage = {{2, 0.5, 0.5, 0}, {1, 1, 1, 1.5}};
  EXPECT_DOUBLE_EQ(busiest_rank_s(make_schedule(ScheduleKind::one_f_one_b, 2, 4), c), 12);
  c.stage[0].f = 1;  // rank 1 the busier: a split table counts the whole B where it is cheaper
  EXPECT_DOUBLE_EQ(busiest_rank_s(make_schedule(ScheduleKind::zb_h1, 2, 4), c), 10);
  for (int trial = 0; trial < 40; ++trial) {
    const int p = 2 + trial % 3, m = 2 * p;
    for (ScheduleKind kind :
         {ScheduleKind::one_f_one_b, ScheduleKind::zb_h1, ScheduleKind::interleaved, ScheduleKind::zb_v}) {
      const Schedule t = make_schedule(kind, p, m, 2);
      SimCosts r;
      for (int g = 0; g < t.layout.stages(); ++g) {
        const double f = 1 + (trial * 31 + g * 17) % 7, i = 1 + (trial * 13 + g * 5) % 5, w = 0.5 + (trial + g) % 3;
        r.stage.push_back({f, i, w, (trial + g) % 2 ? 0.9 * (i + w) : 0});
      }
      const double bound = busiest_rank_s(t, r);
      EXPECT_GT(bound, 0);
      for (const Schedule& x : {t, fuse_all(t), fuse_where_faster(t, r)})
        EXPECT_LE(bound, simulate(x, r).makespan * (1 + 1e-12)) << schedule_name(kind) << " p=" << p;
    }
  }
}

TEST(Partition, UniformListAndErrors) {
  EXPECT_EQ(balance_uniform(5, 2), (std::vector<int>{3, 2}));
  EXPECT_EQ(balance_uniform(8, 4), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_THROW(balance_uniform(3, 4), Error);  // more stages than layers
  EXPECT_EQ(parse_balance("[3, 2, 2]"), (std::vector<int>{3, 2, 2}));
  EXPECT_EQ(check_balance_list({3, 2}, 5, 2), (std::vector<int>{3, 2}));
  EXPECT_THROW(check_balance_list({3, 3}, 5, 2), Error);     // wrong sum
  EXPECT_THROW(check_balance_list({5}, 5, 2), Error);        // wrong length
  EXPECT_THROW(check_balance_list({5, 0}, 5, 2), Error);     // empty stage
  EXPECT_THROW(parse_balance("[3, x]"), Error);
  EXPECT_THROW(parse_partition("random"), Error);
  try {
    balance_uniform(3, 4);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.pipeline = 4 stages, but the model has only 3"), std::string::npos)
        << e.what();
  }
}

TEST(Partition, ParamsAndTimeCostsCoverEveryLayer) {
  ModelConfig mc;
  mc.height = mc.width = 8;
  auto m = std::make_unique<Stage>(mc, Device::cpu());
  std::vector<double> pc = layer_param_costs(plan_model_layers(mc)), tc = layer_time_costs(mc, Device::cpu(), 4, 1);
  ASSERT_EQ(static_cast<int>(pc.size()), m->num_layers());
  ASSERT_EQ(static_cast<int>(tc.size()), m->num_layers());
  // The plan counts what the built model registers.
  for (int i = 0; i < m->num_layers(); ++i) {
    double n = 1;
    for (auto p : m->layer(i).params()) n += static_cast<double>(shape_numel(m->arena().info(p).shape));
    EXPECT_EQ(pc[static_cast<std::size_t>(i)], n) << m->layer(i).name();
  }
  for (double t : tc) EXPECT_GE(t, 0.0);
  // fc1 (64*2*2 -> 128) outweighs flatten (no parameters).
  EXPECT_GT(pc[3], pc[2]);
}

}  // namespace
}  // namespace ringtrain
