#include "ringtrain/parallel/mesh.hpp"

#include "ringtrain/core/error.hpp"

namespace ringtrain {

std::array<int, kMeshDims> Mesh::sizes_for(int world_size, MeshShape s) {
  RT_CHECK(s.tensor >= 1, "configuration key 'parallel.tensor' must be >= 1, got ", s.tensor);
  RT_CHECK(s.pipeline >= 1, "configuration key 'parallel.pipeline' must be >= 1, got ", s.pipeline);
  RT_CHECK(s.context >= 1, "configuration key 'parallel.context' must be >= 1, got ", s.context);
  const int model = s.pipeline * s.context * s.tensor;
  if (s.context == 1)  // the message every release before the mesh gave
    RT_CHECK(world_size % model == 0, "parallel.pipeline = ", s.pipeline, " x parallel.tensor = ", s.tensor,
             " does not divide the ", world_size, " ranks of the job");
  RT_CHECK(world_size % model == 0, "parallel.pipeline = ", s.pipeline, " x parallel.context = ", s.context,
           " x parallel.tensor = ", s.tensor, " does not divide the ", world_size, " ranks of the job");
  RT_CHECK(s.expert >= 1 && (world_size / model) % s.expert == 0, "parallel.expert = ", s.expert,
           " does not divide the data-parallel size ", world_size / model, " (the ", world_size,
           " ranks / parallel.pipeline x parallel.context x parallel.tensor = ", model, ")");
  std::array<int, kMeshDims> n{};
  n[dim_index(Dim::pipeline)] = s.pipeline;
  n[dim_index(Dim::data)] = world_size / model / s.expert;
  n[dim_index(Dim::expert)] = s.expert;
  n[dim_index(Dim::context)] = s.context;
  n[dim_index(Dim::tensor)] = s.tensor;
  return n;
}

int Mesh::size(DimSet s) const {
  int n = 1;
  for (int i = 0; i < kMeshDims; ++i)
    if (s.has(static_cast<Dim>(i))) n *= size_[static_cast<std::size_t>(i)];
  return n;
}

int Mesh::rank_of(const std::array<int, kMeshDims>& c) const {
  int r = 0;
  for (int i = 0; i < kMeshDims; ++i) r = r * size_[static_cast<std::size_t>(i)] + c[static_cast<std::size_t>(i)];
  return r;
}

std::array<int, kMeshDims> Mesh::coords_of(int r) const {
  std::array<int, kMeshDims> c{};
  for (int i = kMeshDims; i-- > 0;) {
    c[static_cast<std::size_t>(i)] = r % size_[static_cast<std::size_t>(i)];
    r /= size_[static_cast<std::size_t>(i)];
  }
  return c;
}

namespace {

// How errors name a group's ranks ("rank 1 of 'pp'"): the short names of earlier releases.
std::string group_name(DimSet s) {
  static const char* const short_names[kMeshDims] = {"pp", "dp", "ep", "cp", "tp"};
  std::string n;
  for (int i = 0; i < kMeshDims; ++i)
    if (s.has(static_cast<Dim>(i))) n += std::string(n.empty() ? "" : "+") + short_names[i];
  return n.empty() ? "self" : n;
}

}  // namespace

Mesh Mesh::make(const Communicator& world_in, MeshShape shape, double timeout_s) {
  // Pure arithmetic on values every rank shares: every rank raises the same Error.
  Mesh m;
  m.size_ = sizes_for(world_in.size(), shape);
  m.coord_ = m.coords_of(world_in.rank());
  m.world_ = world_in.dup("world", timeout_s);
  // group(S): colour = the linear index of the coordinates outside S, key = the one inside.
  for (unsigned bits = 0; bits < (1u << kMeshDims); ++bits) {
    const DimSet s = DimSet::from_bits(bits);
    int colour = 0, key = 0;
    for (int i = 0; i < kMeshDims; ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (s.has(static_cast<Dim>(i))) key = key * m.size_[k] + m.coord_[k];
      else colour = colour * m.size_[k] + m.coord_[k];
    }
    m.groups_.push_back(m.world_.split(colour, key, group_name(s)));
  }
  return m;
}

std::string Mesh::describe() const {
  std::string s;
  for (int i = 0; i < kMeshDims; ++i)
    if (size_[static_cast<std::size_t>(i)] > 1)
      s += cat(s.empty() ? "" : " x ", dim_name(static_cast<Dim>(i)), " ", size_[static_cast<std::size_t>(i)]);
  return s.empty() ? "1 rank" : s;
}

}  // namespace ringtrain
