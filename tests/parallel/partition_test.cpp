// Stage partitioning: the cost-balanced cut is the best contiguous cut
// (checked against brute force), uniform/list policies, and their errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/parallel/partition.hpp"
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

// Every way to cut n layers into p non-empty contiguous stages.
double brute_force(const std::vector<double>& c, int p) {
  const int n = static_cast<int>(c.size());
  double best = 1e300;
  std::vector<int> counts;
  std::function<void(int, int)> rec = [&](int left, int stages) {
    if (stages == 1) {
      counts.push_back(left);
      best = std::min(best, max_stage(c, counts));
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
