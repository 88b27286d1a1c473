// safetensors (interop/safetensors.hpp): round trips, a file from an
// independent writer (tests/interop/write_safetensors.py: struct + json +
// numpy), and every rule of the format broken once, each error naming the
// tensor or the field.
#include "ringtrain/interop/safetensors.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "support/error_of.hpp"

using namespace ringtrain;
using test_support::error_of;
namespace fs = std::filesystem;
namespace st = ringtrain::safetensors;

namespace {

fs::path source_dir() {
  if (const char* s = std::getenv("RINGTRAIN_SOURCE_DIR")) return s;
  return fs::path(__FILE__).parent_path().parent_path().parent_path();
}

struct Safetensors : ::testing::Test {
  fs::path dir = fs::temp_directory_path() / ("rt-safetensors-" + std::to_string(::getpid()));
  void SetUp() override { fs::create_directories(dir); }
  void TearDown() override { fs::remove_all(dir); }

  // A file of the given header text (its length prefixed) and `data_bytes` zero bytes.
  std::string raw(const std::string& name, const std::string& header, std::size_t data_bytes,
                  std::uint64_t claimed = ~0ull) {
    const fs::path p = dir / name;
    std::ofstream f(p, std::ios::binary);
    const std::uint64_t n = claimed == ~0ull ? header.size() : claimed;
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
    f << header << std::string(data_bytes, '\0');
    return p.string();
  }
  std::string open_error(const std::string& path) {
    return error_of([&] { st::Reader r(path); });
  }
};

TEST_F(Safetensors, RoundTripF32AndBf16KeepsBitsShapesOrderAndMetadata) {
  std::vector<float> a(2 * 3);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.1f * float(i) - 0.3f;
  std::vector<bfloat16> b = {to_bf16(1.5f), to_bf16(-0.0078125f), to_bf16(3e8f)};
  const float s = 2.25f;
  const std::string p = (dir / "rt.safetensors").string();
  st::write(p, {{"z.first", DType::f32, {2, 3}, a.data()}, {"a.second", DType::bf16, {3}, b.data()},
                {"m.scalar", DType::f32, {}, &s}},
            {{"format", "pt"}});
  st::Reader r(p);
  ASSERT_EQ(r.tensors().size(), 3u);
  EXPECT_EQ(r.tensors()[0].name, "z.first");  // data order, not the header's (sorted) key order
  EXPECT_EQ(r.tensors()[1].name, "a.second");
  EXPECT_EQ(r.metadata().at("format"), "pt");
  const Tensor ta = r.read(r.at("z.first"));
  EXPECT_EQ(ta.shape(), (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(ta.raw(), a.data(), a.size() * 4), 0);
  const Tensor tb = r.read(r.at("a.second"));
  EXPECT_EQ(tb.dtype(), DType::bf16);
  EXPECT_EQ(std::memcmp(tb.raw(), b.data(), b.size() * 2), 0);
  EXPECT_EQ(r.read(r.at("m.scalar")).shape(), Shape{});
  // A byte range in the middle of a tensor: elements 2..4 of z.first.
  float mid[3];
  r.read(r.at("z.first"), 2 * 4, mid, sizeof mid);
  EXPECT_EQ(std::memcmp(mid, a.data() + 2, sizeof mid), 0);
  // The header is padded so that the data starts 8-byte aligned.
  std::ifstream f(p, std::ios::binary);
  std::uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_NE(error_of([&] { r.at("missing"); }).find("has no tensor 'missing'"), std::string::npos);
}

TEST_F(Safetensors, ReadsAFileFromAnIndependentWriter) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 with numpy is not available";
  const fs::path p = dir / "py.safetensors";
  const std::string cmd =
      "/usr/bin/python3 '" + (source_dir() / "tests/interop/write_safetensors.py").string() + "' '" + p.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  st::Reader r(p.string());
  EXPECT_EQ(r.metadata().at("written_by"), "write_safetensors.py");
  ASSERT_EQ(r.tensors().size(), 4u);
  EXPECT_EQ(r.tensors()[0].name, "c.scalar");  // the script's data order
  const Tensor a = r.read(r.at("a.weight"));
  ASSERT_EQ(a.shape(), (Shape{3, 4}));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(a.data<float>()[i], float(i) * 0.25f - 1.0f) << i;
  const Tensor b = r.read(r.at("b.bias"));
  ASSERT_EQ(b.dtype(), DType::bf16);
  // The script truncates to bfloat16; these values are exact in bfloat16 except 1e-3 (truncated).
  const float want[] = {1.0f, -2.0f, 0.5f, 3.140625f};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(to_f32(b.data<bfloat16>()[i]), want[i]) << i;
  const float t = 1e-3f;
  std::uint32_t u;
  std::memcpy(&u, &t, 4);
  u &= 0xffff0000u;
  float trunc;
  std::memcpy(&trunc, &u, 4);
  EXPECT_EQ(to_f32(b.data<bfloat16>()[4]), trunc);
  EXPECT_EQ(r.read(r.at("c.scalar")).data<float>()[0], 7.5f);
  EXPECT_EQ(r.at("d.empty").shape, (Shape{0, 3}));
}

TEST_F(Safetensors, MalformedFilesAreRefusedNamingTheTensor) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  EXPECT_EQ(open_error(raw("ok", ok, 12)), "<no error>");

  const std::string overlap = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  std::string e = open_error(raw("overlap", overlap, 12));
  EXPECT_NE(e.find("tensor 'b'"), std::string::npos) << e;
  EXPECT_NE(e.find("overlaps tensor 'a'"), std::string::npos) << e;

  const std::string gap = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})";
  e = open_error(raw("gap", gap, 16));
  EXPECT_NE(e.find("tensor 'b' begins at byte 12"), std::string::npos) << e;
  EXPECT_NE(e.find("contiguous"), std::string::npos) << e;

  const std::string late_start = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  e = open_error(raw("late", late_start, 8));
  EXPECT_NE(e.find("tensor 'a' begins at byte 4"), std::string::npos) << e;

  const std::string size = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("w":{"dtype":"BF16","shape":[3,2],"data_offsets":[8,16]}})";
  e = open_error(raw("size", size, 16));
  EXPECT_NE(e.find("tensor 'w'"), std::string::npos) << e;
  EXPECT_NE(e.find("hold 8 bytes, but BF16 [3, 2] needs 12"), std::string::npos) << e;

  const std::string dup = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  e = open_error(raw("dup", dup, 8));
  EXPECT_NE(e.find("tensor 'a' appears twice"), std::string::npos) << e;

  e = open_error(raw("huge", ok, 12, st::kMaxHeaderBytes + 1));
  EXPECT_NE(e.find("exceeds the format's limit of 100000000"), std::string::npos) << e;

  e = open_error(raw("past", ok, 0, ok.size() + 100));
  EXPECT_NE(e.find("runs past the end"), std::string::npos) << e;

  // Truncated inside the data: the last tensor is named.
  e = open_error(raw("truncated", ok, 10));
  EXPECT_NE(e.find("tensor 'b' ends at byte 12"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;

  e = open_error(raw("trailing", ok, 20));
  EXPECT_NE(e.find("8 bytes after the last tensor ('b') belong to no tensor"), std::string::npos) << e;

  e = open_error(raw("empty", "", 0));
  EXPECT_NE(e.find("JSON"), std::string::npos) << e;
  {
    std::ofstream f(dir / "tiny", std::ios::binary);
    f << "abc";
  }
  e = open_error((dir / "tiny").string());
  EXPECT_NE(e.find("too short"), std::string::npos) << e;

  const std::string dtype = R"({"q":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})";
  e = open_error(raw("dtype", dtype, 1));
  EXPECT_NE(e.find("tensor 'q': dtype \"F8_E4M3\" is not supported"), std::string::npos) << e;

  const std::string neg = R"({"n":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})";
  e = open_error(raw("neg", neg, 4));
  EXPECT_NE(e.find("tensor 'n': a shape dimension must be a non-negative integer"), std::string::npos) << e;

  e = open_error(raw("notjson", "{\"a\": [", 0));
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;

  e = open_error((dir / "absent").string());
  EXPECT_NE(e.find("cannot open it"), std::string::npos) << e;

  // The writer refuses a duplicate name too.
  float x = 1;
  e = error_of([&] {
    st::write((dir / "w").string(), {{"t", DType::f32, {1}, &x}, {"t", DType::f32, {1}, &x}});
  });
  EXPECT_NE(e.find("tensor 't' is given twice"), std::string::npos) << e;
}

}  // namespace
