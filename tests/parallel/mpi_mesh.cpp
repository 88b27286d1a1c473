// The mesh of named dimensions (parallel/mesh.hpp), checked against the rank
// arithmetic written out here and against MPI's own view of each group:
//  - for every factorisation of the world into pipeline x data x context x
//    tensor and every set of dimensions, group(S) holds exactly the ranks
//    that share this rank's coordinates outside S, in the order of their
//    world ranks (MPI_Allgather over the group's own handle);
//  - ProcessGrid's groups are the mesh's, in the order of every earlier
//    release (rank = tp + dp·TP + pp·TP·DP);
//  - a parameter's reduce_over picks the group its gradient is averaged over:
//    one layer's weights kept rank-local while the others average, against
//    per-rank reference steps summed with MPI_Allreduce.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/model_registry.hpp"
#include "ringtrain/nn/rng.hpp"
#include "ringtrain/parallel/parts.hpp"
#include "support/error_of.hpp"

namespace ringtrain {
namespace {

struct Coords {
  int pp, dp, cp, tp;
};
// The order the mesh documents, written out: rank = tp + cp·T + dp·T·C + pp·T·C·D.
Coords coords(int r, int D, int C, int T) { return {r / (T * C * D), (r / (T * C)) % D, (r / T) % C, r % T}; }
int coord(const Coords& c, Dim d) {
  return d == Dim::pipeline ? c.pp : d == Dim::data ? c.dp : d == Dim::context ? c.cp : c.tp;
}

std::vector<int> members(const Communicator& g) {
  std::vector<int> out(static_cast<std::size_t>(g.size()));
  const int me = Communicator::world().rank();
  MPI_Allgather(&me, 1, MPI_INT, out.data(), 1, MPI_INT, g.handle("test"));
  return out;
}

std::vector<int> expected_members(int world, int D, int C, int T, DimSet s) {
  const Coords mine = coords(Communicator::world().rank(), D, C, T);
  std::vector<int> out;
  for (int r = 0; r < world; ++r) {
    const Coords c = coords(r, D, C, T);
    bool same = true;
    for (Dim d : {Dim::pipeline, Dim::data, Dim::context, Dim::tensor})
      same = same && (s.has(d) || coord(c, d) == coord(mine, d));
    if (same) out.push_back(r);
  }
  return out;
}

TEST(Mesh, EveryGroupOfEveryFactorisationHoldsTheRanksSharingTheOtherCoordinates) {
  Communicator world = Communicator::world();
  const int n = world.size();
  int layouts = 0;
  for (int P = 1; P <= n; ++P)
    for (int C = 1; P * C <= n; ++C)
      for (int T = 1; P * C * T <= n; ++T) {
        if (n % (P * C * T) != 0) continue;
        const int D = n / (P * C * T);
        Mesh m = Mesh::make(world, {P, C, T});
        ++layouts;
        const Coords mine = coords(world.rank(), D, C, T);
        EXPECT_EQ(m.size(Dim::data), D);
        for (Dim d : {Dim::pipeline, Dim::data, Dim::context, Dim::tensor})
          EXPECT_EQ(m.coord(d), coord(mine, d)) << dim_name(d) << " at " << m.describe();
        EXPECT_EQ(m.rank_of(m.coords()), world.rank());
        for (unsigned bits = 0; bits < 16; ++bits) {
          const DimSet s = DimSet::from_bits(bits);
          const Communicator& g = m.group(s);
          EXPECT_EQ(g.size(), m.size(s)) << s.str() << " at " << m.describe();
          EXPECT_EQ(members(g), expected_members(n, D, C, T, s)) << s.str() << " at " << m.describe();
        }
      }
  EXPECT_GE(layouts, 1);
}

TEST(Mesh, ProcessGridGroupsAreTheMeshsInTheReleasedRankOrder) {
  Communicator world = Communicator::world();
  const int n = world.size();
  for (int P = 1; P <= n; ++P)
    for (int T = 1; P * T <= n; ++T) {
      if (n % (P * T) != 0) continue;
      const int D = n / (P * T);
      ProcessGrid g = ProcessGrid::make(world, {P, T});
      const int r = world.rank();
      // The order of every earlier release: rank = tp + dp·TP + pp·TP·DP.
      EXPECT_EQ(g.tp_rank(), r % T);
      EXPECT_EQ(g.dp_rank(), (r / T) % D);
      EXPECT_EQ(g.pp_rank(), r / (T * D));
      EXPECT_EQ(members(g.dp()), members(g.mesh().group({Dim::data})));
      EXPECT_EQ(members(g.pp()), members(g.mesh().group({Dim::pipeline})));
      EXPECT_EQ(members(g.tp()), members(g.mesh().group({Dim::tensor})));
      EXPECT_EQ(members(g.replica()), members(g.mesh().group({Dim::pipeline, Dim::tensor})));
      EXPECT_EQ(members(g.reduce_group(kDenseReduce)), members(g.dp()));  // context 1
      EXPECT_EQ(g.tp().name(), "tp");  // how errors name a peer ("rank 1 of 'tp'")
      EXPECT_EQ(g.pp().name(), "pp");
    }
  // With a context dimension: data shrinks, the ends pair the first and last stage of each (dp, cp, tp).
  if (n % 4 == 0) {
    ProcessGrid g = ProcessGrid::make(world, {2, 1, 2});
    const Coords c = coords(world.rank(), n / 4, 2, 1);
    EXPECT_EQ(g.dp_size(), n / 4);
    EXPECT_EQ(g.cp_size(), 2);
    EXPECT_EQ(g.cp_rank(), c.cp);
    EXPECT_EQ(members(g.cp()), expected_members(n, n / 4, 2, 1, {Dim::context}));
    EXPECT_EQ(members(g.reduce_group(kDenseReduce)), expected_members(n, n / 4, 2, 1, kDenseReduce));
    EXPECT_EQ(members(g.ends()), expected_members(n, n / 4, 2, 1, {Dim::pipeline}));  // 2 stages: both are ends
    EXPECT_EQ(g.world_rank_of(0, c.dp, c.pp), (c.pp * (n / 4) + c.dp) * 2);
  }
}

TEST(Mesh, SizesThatDoNotDivideTheWorldAreAnErrorNamingTheKeys) {
  const std::string e = test_support::error_of([] { Mesh::sizes_for(6, {4, 1, 1}); });
  EXPECT_NE(e.find("parallel.pipeline = 4 x parallel.tensor = 1 does not divide the 6 ranks"), std::string::npos) << e;
  const std::string c = test_support::error_of([] { Mesh::sizes_for(8, {1, 3, 2}); });
  EXPECT_NE(c.find("parallel.context = 3"), std::string::npos) << c;
  EXPECT_EQ(Mesh::sizes_for(8, {2, 1, 2})[dim_index(Dim::data)], 2);
  EXPECT_EQ(DimSet({Dim::data, Dim::context}).str(), "data x context");
}

// ---- a parameter's group ----------------------------------------------------

// A Linear whose parameters stay on this rank: reduce_over = {} (as an expert
// weight would name its own group).
class LocalLinear : public Linear {
 public:
  using Linear::Linear;
  void register_params(ParamArena& a, int layer, const std::string& prefix) override {
    Linear::register_params(a, layer, prefix);
    for (std::size_t p : params()) a.set_reduce_over(p, DimSet{});
  }
};

const bool registered = [] {
  register_model("mesh_local_head", [](const ModelConfig& c) {
    std::vector<LayerPtr> L;
    L.push_back(std::make_unique<Flatten>("flatten"));
    L.push_back(std::make_unique<Linear>("fc1", LinearSpec{c.in_channels * c.height * c.width, 16, true, true}));
    L.push_back(std::make_unique<LocalLinear>("head", LinearSpec{16, c.classes, true, false}));
    return L;
  });
  return true;
}();

std::pair<Tensor, Tensor> rank_batch(int rank) {
  Tensor x = Tensor::empty({8, 1, 28, 28}), y = Tensor::empty({8}, DType::i64);
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = counter_uniform(11, static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(i)) - 0.5f;
  for (std::int64_t i = 0; i < 8; ++i) y.data<std::int64_t>()[i] = (i + rank) % 10;
  return {x, y};
}

// Parameter deltas of one SGD step (lr 1) on `grid`, each rank on its own batch.
std::vector<std::vector<float>> step_deltas(const ProcessGrid& grid, bool deterministic) {
  ModelConfig mc;
  mc.name = "mesh_local_head";
  GridConfig gc;
  gc.batch = 8;
  gc.deterministic = deterministic;
  OptimizerConfig oc;
  ModelParts parts = build_parts(grid, mc, gc, oc);
  const ParamArena& a = parts.stage->arena();
  std::vector<std::vector<float>> before(a.size()), out(a.size());
  for (std::size_t p = 0; p < a.size(); ++p) {
    Tensor t = a.param(p);
    before[p].assign(t.data<float>(), t.data<float>() + t.numel());
  }
  auto [x, y] = rank_batch(Communicator::world().rank());
  train_step(grid, parts, x, y, 1.0);
  for (std::size_t p = 0; p < a.size(); ++p) {
    Tensor t = a.param(p);
    for (std::int64_t i = 0; i < t.numel(); ++i) out[p].push_back(t.data<float>()[i] - before[p][std::size_t(i)]);
  }
  return out;
}

TEST(Mesh, EachParameterIsAveragedOverItsOwnGroup) {
  ASSERT_TRUE(registered);
  Communicator world = Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs 2+ data-parallel ranks";
  // The reference: this rank's own step, alone.
  ProcessGrid self = ProcessGrid::make(world.split(world.rank(), 0, "self"), {1, 1});
  const auto own = step_deltas(self, false);
  ProcessGrid grid = ProcessGrid::make(world, {1, 1});
  for (bool deterministic : {false, true}) {
    const auto got = step_deltas(grid, deterministic);
    ASSERT_EQ(got.size(), 4u);  // fc1.weight, fc1.bias, head.weight, head.bias
    for (std::size_t p = 0; p < got.size(); ++p) {
      std::vector<float> avg = own[p];
      MPI_Allreduce(MPI_IN_PLACE, avg.data(), static_cast<int>(avg.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      for (float& v : avg) v /= static_cast<float>(world.size());
      const std::vector<float>& want = p < 2 ? avg : own[p];  // fc1 averaged, the head rank-local
      double worst = 0;
      for (std::size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::abs(got[p][i] - want[i])));
      // Measured: 0 for the head (bitwise its own step), up to 1.5e-8 for fc1 (summation order); about 10x.
      EXPECT_LE(worst, p < 2 ? 1.5e-7 : 0.0) << "parameter " << p << " deterministic " << deterministic;
      if (world.rank() == 0) std::printf("parameter %zu: worst |delta - reference| %.3g\n", p, worst);
      // And the head really differs between ranks (else the check above could not fail).
      if (p == 2) {
        double diff = 0;
        for (std::size_t i = 0; i < want.size(); ++i) diff += std::abs(want[i] - avg[i]);
        EXPECT_GT(diff, 1e-6);
      }
    }
  }
}

}  // namespace
}  // namespace ringtrain
