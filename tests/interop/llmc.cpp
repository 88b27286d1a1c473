// llm.c's model file (interop/llmc.hpp): written and read back per layer, and
// each header rule broken once, the error naming the field. The file against
// an independent writer is tests/interop/gpt2_reference.sh's.
#include "ringtrain/interop/llmc.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "support/error_of.hpp"

using namespace ringtrain;
using test_support::error_of;
namespace fs = std::filesystem;

namespace {

struct Llmc : ::testing::Test {
  fs::path dir = fs::temp_directory_path() / ("rt-llmc-" + std::to_string(::getpid()));
  void SetUp() override { fs::create_directories(dir); }
  void TearDown() override { fs::remove_all(dir); }
  // A file whose header holds `h` (eight ints) and `data_bytes` zero bytes.
  std::string raw(const std::string& name, std::vector<std::int32_t> h, std::size_t data_bytes) {
    h.resize(256, 0);
    const fs::path p = dir / name;
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(h.data()), 1024);
    f << std::string(data_bytes, '\0');
    return p.string();
  }
};

TEST_F(Llmc, WrittenAndReadBackPerLayerInLlmcOrder) {
  llmc::ModelHeader h;
  h.max_seq_len = 4, h.vocab = 5, h.layers = 2, h.heads = 2, h.channels = 4, h.padded_vocab = 8;
  // Every parameter's elements are its index in the file order plus its position: all distinct.
  std::map<std::string, std::vector<float>> params;
  float next = 0;
  for (const auto& t : llmc::model_tensors(h)) {
    auto& v = params[t.name];
    v.resize(static_cast<std::size_t>(t.numel()));
    for (auto& x : v) x = next++;
  }
  for (int version : {3, 5}) {
    h.version = version;
    const std::string p = (dir / "m.bin").string();
    llmc::write_model(p, h, [&](const std::string& n) { return params.at(n).data(); });
    EXPECT_TRUE(llmc::is_model_file(p));
    llmc::ModelFile f(p);
    EXPECT_EQ(f.header().heads, 2);
    const auto& ts = f.tensors();
    ASSERT_EQ(ts.size(), 2u + 12u * 2 + 2u);
    EXPECT_EQ(ts[0].name, "wte.weight");
    EXPECT_EQ(ts[0].shape, (Shape{8, 4}));  // padded rows
    EXPECT_EQ(ts[2].name, "blocks.0.norm1.weight");
    EXPECT_EQ(ts[3].name, "blocks.1.norm1.weight");  // stacked over the layers, tensor by tensor
    EXPECT_EQ(ts.back().name, "norm.bias");
    const auto* qkv = f.find("blocks.1.attn.qkv.weight");
    ASSERT_TRUE(qkv);
    EXPECT_EQ(qkv->shape, (Shape{12, 4}));
    std::vector<char> buf(static_cast<std::size_t>(qkv->end - qkv->begin));
    f.read(*qkv, 0, buf.data(), buf.size());
    const auto& want = params.at("blocks.1.attn.qkv.weight");
    for (std::size_t i = 0; i < want.size(); ++i) {
      const float got = version == 3 ? reinterpret_cast<float*>(buf.data())[i]
                                     : to_f32(reinterpret_cast<bfloat16*>(buf.data())[i]);
      EXPECT_EQ(got, version == 3 ? want[i] : to_f32(to_bf16(want[i]))) << i;
    }
    // wte: the model's 5 rows, then zeros.
    std::vector<char> w(static_cast<std::size_t>(ts[0].end - ts[0].begin));
    f.read(ts[0], 0, w.data(), w.size());
    const float row5 = version == 3 ? reinterpret_cast<float*>(w.data())[5 * 4]
                                    : to_f32(reinterpret_cast<bfloat16*>(w.data())[5 * 4]);
    EXPECT_EQ(row5, 0.0f);
  }
}

TEST_F(Llmc, BadHeadersAreRefusedNamingTheField) {
  // maxT 4, V 5, L 1, NH 2, C 4, Vp 8: 8*4 + 4*4 + (2*4 + 12*4 + 12 + 16 + 4 + 2*4 + 16*4 + 16 + 16*4 + 4) + 8 floats.
  const std::size_t floats = 32 + 16 + (8 + 48 + 12 + 16 + 4 + 8 + 64 + 16 + 64 + 4) + 8;
  EXPECT_EQ(error_of([&] { llmc::ModelFile f(raw("ok", {20240326, 3, 4, 5, 1, 2, 4, 8}, floats * 4)); }),
            "<no error>");
  auto err = [&](std::vector<std::int32_t> h, std::size_t bytes) {
    return error_of([&] { llmc::ModelFile f(raw("bad", h, bytes)); });
  };
  std::string e = err({20240520, 3, 4, 5, 1, 2, 4, 8}, floats * 4);
  EXPECT_NE(e.find("magic 20240520, not 20240326"), std::string::npos) << e;
  e = err({20240326, 4, 4, 5, 1, 2, 4, 8}, floats * 4);
  EXPECT_NE(e.find("version 4 is not 3"), std::string::npos) << e;
  e = err({20240326, 3, 4, 5, 1, 3, 4, 8}, floats * 4);
  EXPECT_NE(e.find("C = 4 is not divisible by NH = 3"), std::string::npos) << e;
  e = err({20240326, 3, 4, 9, 1, 2, 4, 8}, floats * 4);
  EXPECT_NE(e.find("V = 9 exceeds the padded Vp = 8"), std::string::npos) << e;
  e = err({20240326, 3, 0, 5, 1, 2, 4, 8}, floats * 4);
  EXPECT_NE(e.find("maxT = 0 must be > 0"), std::string::npos) << e;
  e = err({20240326, 3, 4, 5, 1, 2, 4, 8}, floats * 4 - 4);
  EXPECT_NE(e.find("(truncated?)"), std::string::npos) << e;
  e = err({20240326, 3, 4, 5, 1, 2, 4, 8}, floats * 4 + 4);
  EXPECT_NE(e.find("needs"), std::string::npos) << e;
  EXPECT_FALSE(llmc::is_model_file(raw("tok", {20240520, 1, 10}, 0)));
}

}  // namespace
