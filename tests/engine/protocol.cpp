// White-box checks of the engine's building blocks (one process): message
// encoding, mismatch reports, the response cache's deterministic LRU, batch
// planning and the host FusionOps.
#include <gtest/gtest.h>

#include "../../src/engine/fusion_buffer.hpp"
#include "../../src/engine/message.hpp"
#include "../../src/engine/response_cache.hpp"
#include "ringtrain/engine/fusion_ops.hpp"

using namespace ringtrain;
using namespace ringtrain::engine;

TEST(EngineProtocol, MessagesRoundTrip) {
  RankMessage m;
  m.cache_bits = {0x5ull, ~0ull};
  m.requests = {{"a.weight", {DType::f16, ReduceOp::avg, DeviceKind::cpu, {3, 4}}}, {"b", {DType::i64, ReduceOp::max, DeviceKind::cuda, {}}}};
  auto bytes = encode(m);
  RankMessage d = decode_rank_message(bytes.data(), bytes.size());
  EXPECT_EQ(d.cache_bits, m.cache_bits);
  ASSERT_EQ(d.requests.size(), 2u);
  EXPECT_EQ(d.requests[0].name, "a.weight");
  EXPECT_EQ(d.requests[0].sig, m.requests[0].sig);
  EXPECT_EQ(d.requests[1].sig, m.requests[1].sig);
  EXPECT_THROW(decode_rank_message(bytes.data(), bytes.size() - 1), Error) << "truncation is detected";

  std::vector<Response> rs(2);
  rs[0].name = "x";
  rs[0].sig = {DType::f32, ReduceOp::sum, DeviceKind::cpu, {7}};
  rs[1].type = ResponseType::error;
  rs[1].name = "y";
  rs[1].message = "bad";
  auto rb = encode(rs);
  auto rd = decode_responses(rb.data(), rb.size());
  ASSERT_EQ(rd.size(), 2u);
  EXPECT_EQ(rd[0].sig.shape, Shape{7});
  EXPECT_EQ(rd[1].type, ResponseType::error);
  EXPECT_EQ(rd[1].message, "bad");
}

TEST(EngineProtocol, MismatchMessageGroupsRanks) {
  Signature a{DType::f32, ReduceOp::avg, DeviceKind::cpu, {128, 3136}}, b = a;
  b.shape = {64, 3136};
  EXPECT_EQ(mismatch_message("fc1.weight", {a, b, a}),
            "allreduce 'fc1.weight': shape mismatch: ranks 0,2 submitted [128, 3136], rank 1 submitted [64, 3136]");
  EXPECT_EQ(mismatch_message("fc1.weight", {a, a}), "");
  Signature c = a;
  c.dtype = DType::f64;
  c.op = ReduceOp::sum;
  EXPECT_EQ(mismatch_message("w", {a, c}),
            "allreduce 'w': dtype mismatch: rank 0 submitted float32, rank 1 submitted float64; "
            "op mismatch: rank 0 submitted avg, rank 1 submitted sum");
}

TEST(EngineProtocol, ResponseCacheIsDeterministicLru) {
  Signature s{DType::f32, ReduceOp::avg, DeviceKind::cpu, {4}}, s2 = s;
  s2.shape = {5};
  ResponseCache c(3);
  c.put("a", s, 1);
  c.put("b", s, 2);
  c.put("c", s, 3);
  EXPECT_EQ(c.lookup("b", s), 1);
  EXPECT_EQ(c.lookup("b", s2), -1) << "a changed signature misses";
  c.touch(0, 4);      // a used recently: b is now least recently used
  c.put("d", s, 5);   // evicts b, reuses its slot
  EXPECT_EQ(c.slot_of("b"), -1);
  EXPECT_EQ(c.slot_of("d"), 1);
  EXPECT_EQ(c.words(), 1u);
  c.erase("a");
  c.put("e", s2, 6);  // the freed slot is reused first
  EXPECT_EQ(c.slot_of("e"), 0);
  EXPECT_EQ(c.lookup("e", s2), 0);
  ResponseCache off(0);
  off.put("x", s, 1);
  EXPECT_EQ(off.lookup("x", s), -1);
}

TEST(EngineProtocol, BatchesGroupByDtypeAndRespectTheThreshold) {
  auto mk = [](const char* name, std::int64_t n, DType dt, ReduceOp op = ReduceOp::avg) {
    auto op_ = std::make_shared<Op>();
    op_->name = name;
    op_->input = op_->output = Tensor::zeros({n}, dt);
    op_->sig = {dt, op, DeviceKind::cpu, {n}};
    return op_;
  };
  std::vector<OpPtr> ops{mk("a", 100, DType::f32), mk("b", 10, DType::f64), mk("c", 100, DType::f32),
                         mk("d", 1000, DType::f32), mk("e", 5, DType::f32, ReduceOp::sum)};
  auto bs = plan_batches(ops, 1000, false);  // bytes
  ASSERT_EQ(bs.size(), 4u);
  EXPECT_EQ(bs[0].ops.size(), 2u);  // a + c (800 bytes), d (4000 bytes) alone
  EXPECT_EQ(bs[0].ops[1]->name, "c");
  EXPECT_EQ(bs[1].ops[0]->name, "d");
  EXPECT_EQ(bs[2].ops[0]->name, "b");
  EXPECT_EQ(bs[3].ops[0]->name, "e");  // a different op is never fused with avg
  auto none = plan_batches(ops, 0, false);
  EXPECT_EQ(none.size(), ops.size());
  auto f16 = plan_batches(ops, 1 << 20, true);  // f32 and f64 both travel as f16
  ASSERT_EQ(f16.size(), 2u);
  EXPECT_EQ(f16[0].wire, DType::f16);
  EXPECT_EQ(f16[0].ops.size(), 4u);
  EXPECT_EQ(f16[0].bytes(), (100 + 10 + 100 + 1000) * 2u);
}

TEST(EngineProtocol, CpuFusionOpsScaleAndConvert) {
  auto ops = ringtrain::cpu_fusion_ops();
  float x[4] = {1, 2, 3, 65504};
  ops->scale(x, 4, DType::f32, 0.25, Device::cpu());
  EXPECT_EQ(x[1], 0.5f);
  int iv[3] = {7, -7, 8};
  ops->scale(iv, 3, DType::i32, 1.0 / 4, Device::cpu());
  EXPECT_EQ(iv[0], 1);
  EXPECT_EQ(iv[1], -1);  // truncating division
  EXPECT_EQ(iv[2], 2);
  float src[3] = {1.0f / 3, -2.5f, 1e-8f}, back[3];
  float16 h[3];
  ops->compress_f16(h, src, 3, DType::f32, Device::cpu());
  ops->decompress_f16(back, h, 3, DType::f32, 2.0, Device::cpu());
  EXPECT_NEAR(back[0], 2.0f / 3, 1e-3);
  EXPECT_EQ(back[1], -5.0f);
  EXPECT_EQ(back[2], 0.0f);  // below fp16's subnormal range
}
