#pragma once
// The named dimensions of the process mesh (parallel/mesh.hpp), and sets of
// them. Here rather than with the mesh because a parameter (nn/parameters.hpp)
// says over which dimensions it is replicated, and layers know no communicators.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace ringtrain {

// Outermost first: the order of the mesh's rank arithmetic.
// expert: parallel.expert, carved from the data-parallel ranks (the data
// dimension is what is left of them: the expert-data ranks); see mesh.hpp.
enum class Dim : std::uint8_t { pipeline, data, expert, context, tensor };
constexpr int kMeshDims = 5;
constexpr int dim_index(Dim d) { return static_cast<int>(d); }

// Everything the rest of the code needs to know of a dimension, in one table:
// the mesh, the configuration, the GPU gate, log tags and errors loop over it,
// so a new dimension is a row here, its key, and its own parallel part.
struct DimInfo {
  const char* name;        // "context": DimSet::str, Mesh::describe
  const char* short_name;  // "cp": communicator names in errors, the log tag "[dp 1 cp 0]"
  const char* key;         // "parallel.context": its size ("" = data: what the others leave of the world)
  const char* feature;     // "context parallelism": the GPU validation gate's name (train/gpu_gate.hpp)
  bool carved_from_data;   // its ranks are data-parallel replicas for dense weights (expert: mesh.hpp)
};
inline constexpr DimInfo kDims[kMeshDims] = {
    {"pipeline", "pp", "parallel.pipeline", "pipeline parallelism", false},
    {"data", "dp", "", "data parallelism", false},
    {"expert", "ep", "parallel.expert", "expert parallelism", true},
    {"context", "cp", "parallel.context", "context parallelism", false},
    {"tensor", "tp", "parallel.tensor", "tensor parallelism", false},
};
constexpr const DimInfo& dim_info(Dim d) { return kDims[dim_index(d)]; }
inline const char* dim_name(Dim d) { return dim_info(d).name; }
constexpr Dim dim_at(int i) { return static_cast<Dim>(i); }

// The sizes of the dimensions (kDims' keys); data is what the others leave of the world.
struct MeshShape {
  std::array<int, kMeshDims> size{1, 1, 1, 1, 1};  // the data entry is ignored
  MeshShape() = default;
  // The positional form of earlier releases.
  MeshShape(int pipeline, int context = 1, int tensor = 1, int expert = 1) {
    (*this)[Dim::pipeline] = pipeline, (*this)[Dim::context] = context, (*this)[Dim::tensor] = tensor;
    (*this)[Dim::expert] = expert;
  }
  int& operator[](Dim d) { return size[static_cast<std::size_t>(dim_index(d))]; }
  int operator[](Dim d) const { return size[static_cast<std::size_t>(dim_index(d))]; }
};

class DimSet {
 public:
  constexpr DimSet() = default;
  constexpr DimSet(std::initializer_list<Dim> dims) {
    for (Dim d : dims) bits_ |= static_cast<std::uint8_t>(1u << dim_index(d));
  }
  static constexpr DimSet all() { return from_bits((1u << kMeshDims) - 1); }
  static constexpr DimSet from_bits(unsigned b) {
    DimSet s;
    s.bits_ = static_cast<std::uint8_t>(b);
    return s;
  }
  constexpr bool has(Dim d) const { return (bits_ >> dim_index(d)) & 1u; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr unsigned bits() const { return bits_; }
  constexpr bool operator==(const DimSet& o) const { return bits_ == o.bits_; }
  constexpr bool operator!=(const DimSet& o) const { return bits_ != o.bits_; }
  constexpr bool operator<(const DimSet& o) const { return bits_ < o.bits_; }
  // "data × context" ("none" when empty).
  std::string str() const;

 private:
  std::uint8_t bits_ = 0;
};

// What every parameter is replicated over unless its layer says otherwise:
// the data-parallel replicas (data x expert) and the context ranks (which see other tokens of
// the same samples). Tensor shards differ per tensor rank; a replicated
// parameter of a tensor-parallel layer gets the same gradient on each tensor
// rank by construction and is not averaged over them.
constexpr DimSet kDenseReduce{Dim::data, Dim::expert, Dim::context};
// An expert's weights (nn/moe.hpp) at parallel.expert > 1: the ranks holding the
// same experts, i.e. the data-parallel ranks with this rank's expert coordinate.
constexpr DimSet kExpertReduce{Dim::data, Dim::context};

}  // namespace ringtrain
