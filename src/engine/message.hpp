#pragma once
// Negotiation messages of the fusion engine and their byte encoding.
// Rules: the encoding is little-endian-agnostic only across identical builds
// (all ranks run the same binary); decode() validates lengths and throws an
// Error on a truncated or corrupt message instead of reading past the end.
#include <cstdint>
#include <string>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/device.hpp"
#include "ringtrain/core/dtype.hpp"
#include "ringtrain/core/tensor.hpp"

namespace ringtrain::engine {

// What every rank must agree on for one tensor name.
struct Signature {
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  DeviceKind device = DeviceKind::cpu;
  Shape shape;
  bool operator==(const Signature&) const = default;
};

struct Request {
  std::string name;
  Signature sig;
};

// What a rank sends to the coordinator in a full negotiation round.
struct RankMessage {
  std::vector<std::uint64_t> cache_bits;  // this rank's ready bits for cached names
  std::vector<Request> requests;          // new or changed tensors, each sent once
};

enum class ResponseType : std::uint8_t {
  ok = 0,        // reduce `name` (ready on all ranks with `sig`); cache it
  error = 1,     // fail `name` on every rank with `message`; uncache it
  warning = 2,   // stall warning text, for every rank's hook
  shutdown = 3,  // fail everything outstanding with `message`, stop the engine
};

struct Response {
  ResponseType type = ResponseType::ok;
  std::string name;
  Signature sig;
  std::string message;
};

std::vector<std::uint8_t> encode(const RankMessage& m);
RankMessage decode_rank_message(const std::uint8_t* data, std::size_t n);
std::vector<std::uint8_t> encode(const std::vector<Response>& r);
std::vector<Response> decode_responses(const std::uint8_t* data, std::size_t n);

// "rank 1" / "ranks 0,2"
std::string ranks_str(const std::vector<int>& ranks);
// The mismatch report for one name given every rank's signature, or "" when
// all agree. Example: "allreduce 'fc1.weight': shape mismatch: ranks 0,2
// submitted [128, 3136], rank 1 submitted [64, 3136]".
std::string mismatch_message(const std::string& name, const std::vector<Signature>& per_rank);

const char* device_kind_name(DeviceKind k);

}  // namespace ringtrain::engine
