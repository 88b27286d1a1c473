#pragma once
// The named dimensions of the process mesh (parallel/mesh.hpp), and sets of
// them. Here rather than with the mesh because a parameter (nn/parameters.hpp)
// says over which dimensions it is replicated, and layers know no communicators.
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
const char* dim_name(Dim d);  // "pipeline", "data", "expert", "context", "tensor"

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
