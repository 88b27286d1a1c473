#include "ringtrain/parallel/mesh.hpp"

#include "ringtrain/core/error.hpp"

namespace ringtrain {

std::array<int, kMeshDims> Mesh::sizes_for(int world_size, MeshShape s) {
  // Every dimension but data is given; data is what they leave. A dimension carved from
  // the data ranks (expert) must divide what the others leave.
  std::string model_keys, carved_keys;
  int model = 1, carved = 1;
  for (int i = 0; i < kMeshDims; ++i) {
    const DimInfo& d = kDims[i];
    if (dim_at(i) == Dim::data) continue;
    RT_CHECK(s[dim_at(i)] >= 1, "configuration key '", d.key, "' must be >= 1, got ", s[dim_at(i)]);
    if (s[dim_at(i)] == 1 && (dim_at(i) != Dim::pipeline && dim_at(i) != Dim::tensor)) continue;
    std::string& keys = d.carved_from_data ? carved_keys : model_keys;
    keys += cat(keys.empty() ? "" : " x ", d.key, " = ", s[dim_at(i)]);
    (d.carved_from_data ? carved : model) *= s[dim_at(i)];
  }
  RT_CHECK(world_size % model == 0, model_keys, " does not divide the ", world_size, " ranks of the job");
  RT_CHECK((world_size / model) % carved == 0, carved_keys, " does not divide the data-parallel size ",
           world_size / model, " (the ", world_size, " ranks / ", model_keys, ")");
  std::array<int, kMeshDims> n = s.size;
  n[dim_index(Dim::data)] = world_size / model / carved;
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
  std::string n;
  for (int i = 0; i < kMeshDims; ++i)
    if (s.has(dim_at(i))) n += std::string(n.empty() ? "" : "+") + kDims[i].short_name;
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
