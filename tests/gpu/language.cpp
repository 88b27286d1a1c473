// The token embedding's Backend ops on CUDA (kernels/embedding.cu) against the
// CPU backend on the same inputs: the lookup (whole vocabulary with positions,
// and a vocabulary shard without) bitwise in float32 and bfloat16, float16
// against the CPU's float32 result rounded once on the host; the adjoint
// (accumulating into existing gradients, repeated and out-of-shard tokens)
// bitwise, since both sum each row's tokens in token order; a bad token id is
// an Error naming the input on both. gpt itself stays behind the GPU
// validation gate until a GPU run lists it.
#include <cstring>

#include "gpu_test_util.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/backend.hpp"

using namespace ringtrain;
using namespace rt_gpu;

namespace {

Backend& cpu() { return backend_for(DeviceKind::cpu); }
Backend& cuda_be() { return backend_for(DeviceKind::cuda); }

constexpr std::int64_t kVocab = 1000, kN = 4, kT = 16, kD = 40, kPositions = 24;

// Token ids with repeats (every 7th token is token 3) and both ends of the vocabulary.
Tensor token_ids() {
  Tensor ids = Tensor::empty({kN, kT});
  float* p = ids.data<float>();
  for (std::int64_t i = 0; i < kN * kT; ++i) p[i] = i % 7 == 0 ? 3.f : float((i * 7919) % kVocab);
  p[1] = 0.f, p[2] = float(kVocab - 1);
  return ids;
}

std::vector<std::uint16_t> bits16(const Tensor& t) {
  Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  std::vector<std::uint16_t> v(static_cast<std::size_t>(h.numel()));
  std::memcpy(v.data(), h.raw(), v.size() * 2);
  return v;
}

}  // namespace

TEST(CudaEmbedding, LookupMatchesTheCpuBitwise) {
  const Tensor ids = token_ids(), w = randu({kVocab, kD}, 1), pos = randu({kPositions, kD}, 2);
  const Tensor dids = ids.to(gpu()), dw = w.to(gpu()), dpos = pos.to(gpu());
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor rows = Tensor::empty({kN * kT}, DType::i32), y = Tensor::empty({kN, kT, kD}, dt);
    Tensor drows = Tensor::empty({kN * kT}, DType::i32, gpu()), dy = Tensor::empty({kN, kT, kD}, dt, gpu());
    cpu().embedding_forward(ids, kVocab, 0, w, pos, rows, y);
    cuda_be().embedding_forward(dids, kVocab, 0, dw, dpos, drows, dy);
    if (dt == DType::f32) EXPECT_EQ(host_f32(dy), host_f32(y)) << "float32 lookup + position";
    else EXPECT_EQ(bits16(dy), bits16(y)) << "bfloat16 lookup + position";
    EXPECT_EQ(std::memcmp(rows.raw(), drows.to(Device::cpu()).raw(), rows.nbytes()), 0) << "rows";
  }
  // float16 (CUDA only): the CPU's float32 sums rounded once on the host.
  Tensor rows = Tensor::empty({kN * kT}, DType::i32), y32 = Tensor::empty({kN, kT, kD});
  cpu().embedding_forward(ids, kVocab, 0, w, pos, rows, y32);
  Tensor drows = Tensor::empty({kN * kT}, DType::i32, gpu()), d16 = Tensor::empty({kN, kT, kD}, DType::f16, gpu());
  cuda_be().embedding_forward(dids, kVocab, 0, dw, dpos, drows, d16);
  EXPECT_EQ(bits16(d16), bits16(host_cast(y32, DType::f16))) << "float16 lookup + position";
}

TEST(CudaEmbedding, ShardLookupZeroesOtherRanksTokens) {
  // Rank 1 of 4: rows [250, 500) of the vocabulary, no positions (added after the group's sum).
  const std::int64_t first = 250, local = 250;
  const Tensor ids = token_ids(), w = randu({local, kD}, 3);
  Tensor rows = Tensor::empty({kN * kT}, DType::i32), y = Tensor::empty({kN, kT, kD});
  Tensor drows = Tensor::empty({kN * kT}, DType::i32, gpu()), dy = Tensor::empty({kN, kT, kD}, DType::f32, gpu());
  cpu().embedding_forward(ids, kVocab, first, w, Tensor{}, rows, y);
  cuda_be().embedding_forward(ids.to(gpu()), kVocab, first, w.to(gpu()), Tensor{}, drows, dy);
  EXPECT_EQ(host_f32(dy), host_f32(y));
  const Tensor hr = drows.to(Device::cpu());
  const std::int32_t* r = hr.data<std::int32_t>();
  std::int64_t inside = 0;
  for (std::int64_t i = 0; i < kN * kT; ++i) {
    const std::int64_t id = std::int64_t(ids.data<float>()[i]);
    EXPECT_EQ(r[i], id >= first && id < first + local ? std::int32_t(id - first) : -1) << "token " << i;
    inside += r[i] >= 0;
  }
  EXPECT_GT(inside, 0) << "test setup: no token in the shard";
  EXPECT_LT(inside, kN * kT) << "test setup: every token in the shard";
}

TEST(CudaEmbedding, BackwardMatchesTheCpuBitwise) {
  const Tensor ids = token_ids(), w = randu({kVocab, kD}, 4);
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor rows = Tensor::empty({kN * kT}, DType::i32), y = Tensor::empty({kN, kT, kD}, dt);
    cpu().embedding_forward(ids, kVocab, 0, w, Tensor{}, rows, y);
    const Tensor g = host_cast(randu({kN, kT, kD}, 5), dt);
    // Accumulating into gradients that already hold values (a tied head wrote its part).
    Tensor gw = randu({kVocab, kD}, 6), gp = randu({kPositions, kD}, 7);
    Tensor dgw = gw.to(gpu()), dgp = gp.to(gpu());
    cpu().embedding_backward(g, rows, gw, gp);
    cuda_be().embedding_backward(g.to(gpu()), rows.to(gpu()), dgw, dgp);
    EXPECT_EQ(host_f32(dgw), host_f32(gw)) << dtype_name(dt) << " weight gradient";
    EXPECT_EQ(host_f32(dgp), host_f32(gp)) << dtype_name(dt) << " position gradient";
  }
  // Without positions, and with tokens outside a shard (-1 rows) skipped.
  Tensor rows = Tensor::empty({kN * kT}, DType::i32), y = Tensor::empty({kN, kT, kD});
  cpu().embedding_forward(ids, kVocab, 500, randu({300, kD}, 8), Tensor{}, rows, y);
  const Tensor g = randu({kN, kT, kD}, 9);
  Tensor gw = Tensor::zeros({300, kD}), dgw = Tensor::zeros({300, kD}, DType::f32, gpu()), none;
  cpu().embedding_backward(g, rows, gw, none);
  cuda_be().embedding_backward(g.to(gpu()), rows.to(gpu()), dgw, none);
  EXPECT_EQ(host_f32(dgw), host_f32(gw)) << "shard weight gradient";
}

TEST(CudaEmbedding, BadTokenIdIsAnErrorNamingTheInput) {
  Tensor ids = token_ids();
  ids.data<float>()[5] = 2.5f;
  ids.data<float>()[9] = float(kVocab);
  const Tensor w = randu({kVocab, kD}, 10);
  Tensor rows = Tensor::empty({kN * kT}, DType::i32), y = Tensor::empty({kN, kT, kD});
  Tensor drows = Tensor::empty({kN * kT}, DType::i32, gpu()), dy = Tensor::empty({kN, kT, kD}, DType::f32, gpu());
  for (Backend* be : {&cpu(), &cuda_be()}) {
    const bool dev = be == &cuda_be();
    try {
      be->embedding_forward(dev ? ids.to(gpu()) : ids, kVocab, 0, dev ? w.to(gpu()) : w, Tensor{}, dev ? drows : rows,
                            dev ? dy : y);
      ADD_FAILURE() << be->name() << ": token id 2.5 accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("input 5 = 2.5 is not a token id in [0, 1000)"), std::string::npos)
          << be->name() << ": " << e.what();
    }
  }
}
