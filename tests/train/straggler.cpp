// The straggler arithmetic (train/straggler.hpp) on hand-made per-rank times:
// the slowdown is against the median of the *other* ranks of the same pipeline
// stage, the wait fraction is the peers' extra wait over their step time, and
// a warning comes once per streak of intervals above the factor.
#include <gtest/gtest.h>

#include "ringtrain/train/config.hpp"
#include "ringtrain/train/straggler.hpp"

using namespace ringtrain;

TEST(Straggler, SlowestRankAgainstTheMedianOfItsPeers) {
  // Rank 2 computes 3 s where the others compute 1 s; they wait 2 s more than it does.
  std::vector<RankTimes> t = {{1.0, 2.1, 0}, {1.2, 1.9, 0}, {3.0, 0.1, 0}, {0.9, 2.2, 0}};
  SlowestRank s = find_slowest(t);
  EXPECT_EQ(s.rank, 2);
  EXPECT_DOUBLE_EQ(s.peer_median_s, 1.0);  // median of 1.0, 1.2, 0.9
  EXPECT_DOUBLE_EQ(s.slowdown, 3.0);
  const double expect = ((2.1 - 0.1) / 3.1 + (1.9 - 0.1) / 3.1 + (2.2 - 0.1) / 3.1) / 3;
  EXPECT_NEAR(s.wait_fraction, expect, 1e-12);
  std::vector<double> sd = slowdowns(t);
  EXPECT_DOUBLE_EQ(sd[0], 1.0 / 1.2);  // the others: 1.2, 3.0, 0.9
  EXPECT_DOUBLE_EQ(sd[1], 1.2 / 1.0);  // the others: 1.0, 3.0, 0.9
}

TEST(Straggler, TwoRanksCompareWithEachOther) {
  // The median of both (2 s) would make a 3x straggler look 1.5x.
  std::vector<RankTimes> t = {{1.0, 2.0, 0}, {3.0, 0.0, 0}};
  SlowestRank s = find_slowest(t);
  EXPECT_EQ(s.rank, 1);
  EXPECT_DOUBLE_EQ(s.slowdown, 3.0);
  EXPECT_NEAR(s.wait_fraction, 2.0 / 3.0, 1e-12);
}

TEST(Straggler, PipelineStagesAreNotComparedWithEachOther) {
  // Stage 1 does 5x the work of stage 0 (an uneven partition): nobody is slow against its peers.
  std::vector<RankTimes> t = {{1.0, 4.0, 0}, {1.0, 4.0, 0}, {5.0, 0.0, 1}, {5.0, 0.0, 1}};
  for (double d : slowdowns(t)) EXPECT_DOUBLE_EQ(d, 1.0);
  EXPECT_DOUBLE_EQ(find_slowest(t).slowdown, 1.0);
  EXPECT_EQ(find_slowest(t).wait_fraction, 0.0);
  // One rank per stage: nothing to compare, nobody named.
  std::vector<RankTimes> alone = {{1.0, 4.0, 0}, {5.0, 0.0, 1}};
  EXPECT_EQ(find_slowest(alone).rank, -1);
  EXPECT_EQ(slowdowns(alone), (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(find_slowest({{1.0, 0.0, 0}}).rank, -1);
  EXPECT_EQ(find_slowest({{0.0, 0.0, 0}, {0.0, 0.0, 0}}).rank, -1);  // no step timed
}

TEST(Straggler, EqualRanksNameTheFirstWithSlowdownOne) {
  std::vector<RankTimes> t = {{2.0, 0.5, 0}, {2.0, 0.5, 0}, {2.0, 0.5, 0}};
  SlowestRank s = find_slowest(t);
  EXPECT_EQ(s.rank, 0);
  EXPECT_DOUBLE_EQ(s.slowdown, 1.0);
  EXPECT_EQ(s.wait_fraction, 0.0);
}

TEST(Straggler, WarningOncePerStreakOfThreeIntervals) {
  StragglerStreaks k(1.5);
  using V = std::vector<double>;
  using R = std::vector<int>;
  EXPECT_EQ(k.update(V{1.0, 2.0}), R{});
  EXPECT_EQ(k.update(V{1.0, 2.0}), R{});
  EXPECT_EQ(k.update(V{1.0, 1.4}), R{});  // broken: starts again
  EXPECT_EQ(k.streak(1), 0);
  EXPECT_EQ(k.update(V{1.0, 1.6}), R{});
  EXPECT_EQ(k.update(V{1.0, 3.0}), R{});
  EXPECT_EQ(k.update(V{1.0, 1.51}), R{1});  // third in a row
  EXPECT_EQ(k.update(V{1.0, 2.0}), R{});    // still slow: already named
  EXPECT_EQ(k.streak(1), 4);
  EXPECT_EQ(k.update(V{1.5, 1.0}), R{});    // exactly the factor is not more than it
  for (int i = 0; i < 2; ++i) EXPECT_EQ(k.update(V{1.0, 2.0}), R{});
  EXPECT_EQ(k.update(V{1.0, 2.0}), R{1});   // a new streak is named again
}

TEST(Straggler, FactorZeroNeverWarns) {
  StragglerStreaks k(0);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(k.update({1.0, 100.0}).empty());
}

TEST(Straggler, FactorKeyIsZeroOrAboveOne) {
  TrainConfig c;
  EXPECT_EQ(c.comm.straggler_factor, 1.5);
  c.set("comm.straggler_factor=0");
  EXPECT_NO_THROW(c.validate());
  c.set("comm.straggler_factor=3");
  EXPECT_NO_THROW(c.validate());
  for (const char* bad : {"comm.straggler_factor=1", "comm.straggler_factor=0.5", "comm.straggler_factor=-2"}) {
    c.set(bad);
    try {
      c.validate();
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'comm.straggler_factor' must be 0 (off) or in (1, 1e6]"), std::string::npos)
          << e.what();
    }
  }
}

// --print-config and checkpoints store the factor (the run's identity, which
// --resume auto matches, leaves it out: config_checkpoint tests that).
TEST(Straggler, FactorIsInTheConfigurationText) {
  TrainConfig b;
  b.comm.straggler_factor = 4;
  EXPECT_NE(b.to_toml().find("straggler_factor = 4"), std::string::npos);
}
