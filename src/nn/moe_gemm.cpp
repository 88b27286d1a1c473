// ExpertGemm (moe_gemm.hpp): the experts' GEMMs as one oneDNN batched matmul,
// or a loop of OpenBLAS / oneDNN calls.
#include "moe_gemm.hpp"

#include <cblas.h>

#include <cstring>

#include "../backend/cpu/cpu_backend.hpp"

namespace ringtrain::detail {

struct ExpertGemm::Impl {
  cpu::Dnnl dnnl;
  // oneDNN primitives by shape. The padded row count changes with the routing,
  // so the cache is dropped when it grows past a bound rather than kept forever.
  std::map<std::vector<std::int64_t>, std::unique_ptr<cpu::Matmul>> cache;

  cpu::Matmul& matmul(int groups, const GroupedGemm& g) {
    std::uint32_t alpha_bits = 0;
    std::memcpy(&alpha_bits, &g.alpha, sizeof alpha_bits);
    std::vector<std::int64_t> key{groups, g.m, g.n, g.k, g.ta, g.tb, g.lda, g.sa, g.ldb, g.sb, g.ldc, g.sc,
                                  std::int64_t(alpha_bits), g.accumulate};
    auto it = cache.find(key);
    if (it != cache.end()) return *it->second;
    if (cache.size() >= 64) cache.clear();
    cpu::MatmulShape s;
    if (groups > 1) {  // the experts as the batch dimension (one expert: plain matrices)
      s.a = {groups}, s.a_strides = {g.sa};
      s.b = {groups}, s.b_strides = {g.sb};
      s.c = {groups}, s.c_strides = {g.sc};
    }
    cpu::set_matrix(s.a, s.a_strides, g.m, g.k, g.lda, g.ta);
    cpu::set_matrix(s.b, s.b_strides, g.k, g.n, g.ldb, g.tb);
    cpu::set_matrix(s.c, s.c_strides, g.m, g.n, g.ldc, false);
    s.alpha = g.alpha;
    s.accumulate = g.accumulate;
    return *cache.emplace(std::move(key), std::make_unique<cpu::Matmul>(s, dnnl.eng)).first->second;
  }
};

ExpertGemm::ExpertGemm(ExpertGemmMode mode) : mode_(mode) {
  if (mode != ExpertGemmMode::blas_loop) impl_ = std::make_unique<Impl>();
}

ExpertGemm::~ExpertGemm() = default;

namespace {

// One group's GEMM on OpenBLAS (k == 0: C = beta C, which BLAS may skip).
void blas(const GroupedGemm& g, const float* a, const float* b, float* c) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    if (!g.accumulate)
      for (std::int64_t i = 0; i < g.m; ++i) std::memset(c + i * g.ldc, 0, sizeof(float) * std::size_t(g.n));
    return;
  }
  cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, int(g.m), int(g.n),
              int(g.k), g.alpha, a, int(g.lda), b, int(g.ldb), g.accumulate ? 1.f : 0.f, c, int(g.ldc));
}

}  // namespace

void ExpertGemm::run(const GroupedGemm& g, const std::vector<std::int64_t>& rows, bool rows_are_k) {
  const auto groups = static_cast<int>(rows.size());
  if (groups == 0 || g.n == 0 || (rows_are_k ? g.m : g.k) == 0) return;
  const std::int64_t stride = rows_are_k ? g.k : g.m;
  if (mode_ == ExpertGemmMode::dnnl_grouped && stride > 0) {
    impl_->matmul(groups, g).run(impl_->dnnl.strm, g.a, g.b, g.c);
    return;
  }
  for (int l = 0; l < groups; ++l) {
    GroupedGemm one = g;
    (rows_are_k ? one.k : one.m) = rows[l];
    const float *a = g.a + l * g.sa, *b = g.b + l * g.sb;
    float* c = g.c + l * g.sc;
    if (mode_ == ExpertGemmMode::blas_loop || one.m == 0 || one.k == 0) {
      blas(one, a, b, c);
    } else {
      impl_->matmul(1, one).run(impl_->dnnl.strm, a, b, c);
    }
  }
}

void ExpertGemm::run_rows(const GroupedGemm& g, const std::vector<std::int64_t>& first,
                          const std::vector<std::int64_t>& rows) {
  RT_CHECK(mode_ != ExpertGemmMode::dnnl_grouped && !g.ta && first.size() == rows.size(),
           "ExpertGemm::run_rows: the loop modes, untransposed A and one first row per group only");
  GroupedGemm at = g;
  for (std::size_t l = 0; l < rows.size(); ++l) {
    if (rows[l] == 0) continue;
    at.a = g.a + l * g.sa + first[l] * g.lda;
    at.c = g.c + l * g.sc + first[l] * g.ldc;
    at.b = g.b + l * g.sb;
    run(at, {rows[l]}, false);
  }
}

}  // namespace ringtrain::detail
