#pragma once
// Which pipeline rank holds which model chunk (schedule.hpp explains the
// placements). The model is cut into S = ranks x chunks stages (global stage
// indices 0..S-1 in model order); a rank's chunk k is stage stage_of(rank, k).
//   loop  stage g on rank g mod p (Megatron's interleaved virtual stages);
//   v     zig-zag: chunk k of rank r is stage k·p + r for even k and
//         k·p + p-1-r for odd k (ZB-V: rank 0 holds the first and last stage).
namespace ringtrain {

enum class ChunkPlacement { loop, v };

struct PipelineLayout {
  int ranks = 1;   // p: pipeline ranks
  int chunks = 1;  // v: model chunks per rank
  ChunkPlacement placement = ChunkPlacement::loop;

  int stages() const { return ranks * chunks; }
  int rank_of(int stage) const;
  int chunk_of(int stage) const { return stage / ranks; }  // its index on its rank
  int stage_of(int rank, int chunk) const;
  bool operator==(const PipelineLayout&) const = default;
};

}  // namespace ringtrain
