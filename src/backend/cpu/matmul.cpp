// oneDNN matmul on caller pointers (Linear and attention, float32 and
// bfloat16), f32 <-> bf16 casts, and which ISA runs bf16 math.
#include <unordered_map>

#include "cpu_backend.hpp"

namespace ringtrain::cpu {

using namespace dnnl;

dt dnnl_type(const Tensor& t, const char* what) {
  RT_CHECK(t.defined() && t.device().is_cpu(), "cpu backend: ", what, " must be a CPU tensor");
  if (t.dtype() == DType::f32) return dt::f32;
  if (t.dtype() == DType::bf16) return dt::bf16;
  RT_FAIL("cpu backend: ", what, " must be float32 or bfloat16, got ", dtype_name(t.dtype()));
}

void set_matrix(memory::dims& dims, memory::dims& strides, std::int64_t m, std::int64_t k, std::int64_t ld,
                bool trans) {
  dims.push_back(m);
  dims.push_back(k);
  strides.push_back(trans ? 1 : ld);
  strides.push_back(trans ? ld : 1);
}

Matmul::Matmul(const MatmulShape& s, const engine& eng) {
  memory::desc ad(s.a, s.a_type, s.a_strides), bd(s.b, s.b_type, s.b_strides), cd(s.c, s.c_type, s.c_strides);
  primitive_attr attr;
  if (s.alpha != 1.f) attr.set_output_scales(0, {s.alpha});
  post_ops po;
  if (s.accumulate) po.append_sum(1.f);
  if (s.relu) po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
  attr.set_post_ops(po);
  memory::desc biasd;
  if (s.bias) {
    memory::dims bdims(s.c.size(), 1);
    bdims.back() = s.c.back();
    memory::dims bs(bdims.size(), s.c.back());
    bs.back() = 1;
    biasd = memory::desc(bdims, dt::f32, bs);
  }
  matmul::primitive_desc pd = s.bias ? matmul::primitive_desc(matmul::desc(ad, bd, biasd, cd), attr, eng)
                                     : matmul::primitive_desc(matmul::desc(ad, bd, cd), attr, eng);
  impl_ = pd.impl_info_str();
  prim_ = matmul(pd);
  a_ = memory(ad, eng, DNNL_MEMORY_NONE);
  b_ = memory(bd, eng, DNNL_MEMORY_NONE);
  c_ = memory(cd, eng, DNNL_MEMORY_NONE);
  if (s.bias) bias_ = memory(biasd, eng, DNNL_MEMORY_NONE);
}

void Matmul::run(stream& strm, const void* a, const void* b, void* c, const void* bias) {
  a_.set_data_handle(const_cast<void*>(a));
  b_.set_data_handle(const_cast<void*>(b));
  c_.set_data_handle(c);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, b_}, {DNNL_ARG_DST, c_}};
  if (bias) {
    bias_.set_data_handle(const_cast<void*>(bias));
    args.emplace(DNNL_ARG_BIAS, bias_);
  }
  prim_.execute(strm, args);
  strm.wait();
}

void Caster::run(const void* src, dt st, void* dst, dt dtt, std::int64_t n) {
  if (n == 0) return;
  auto key = std::make_tuple(n, int(st), int(dtt));
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    memory::desc sd({n}, st, memory::format_tag::x), dd({n}, dtt, memory::format_tag::x);
    it = cache_.emplace(key, reorder(reorder::primitive_desc(d_->eng, sd, d_->eng, dd))).first;
  }
  memory::desc sd({n}, st, memory::format_tag::x), dd({n}, dtt, memory::format_tag::x);
  memory sm(sd, d_->eng, const_cast<void*>(src)), dm(dd, d_->eng, dst);
  it->second.execute(d_->strm, sm, dm);
  d_->strm.wait();
}

__attribute__((target_clones("arch=x86-64-v4", "arch=haswell", "default"))) void bf16_to_f32(
    const bfloat16* src, float* dst, std::int64_t n) {
  const std::uint16_t* s = &src->bits;
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) dst[i] = bits_f32(static_cast<std::uint32_t>(s[i]) << 16);
}

__attribute__((target_clones("arch=x86-64-v4", "arch=haswell", "default"))) void f32_to_bf16(
    const float* src, bfloat16* dst, std::int64_t n) {
  std::uint16_t* d = &dst->bits;
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t u = f32_bits(src[i]);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    d[i] = nan ? static_cast<std::uint16_t>((u >> 16) | 0x40) : static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

bool native_bf16() {
  const cpu_isa isa = get_effective_cpu_isa();
  return isa == cpu_isa::avx512_core_bf16 || isa == cpu_isa::avx512_core_amx;
}

std::string bf16_isa() {
  const cpu_isa isa = get_effective_cpu_isa();
  if (isa == cpu_isa::avx512_core_amx) return "AMX";
  if (isa == cpu_isa::avx512_core_bf16) return "AVX512-BF16";
  if (isa == cpu_isa::avx512_core) return "emulated (AVX-512 without bf16 instructions)";
  return "emulated (no AVX-512: oneDNN's reference bf16 kernels, slow)";
}

}  // namespace ringtrain::cpu
