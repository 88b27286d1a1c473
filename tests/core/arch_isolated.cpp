// The build is not x86-only: intrinsics, x86 headers and CPU feature checks
// appear only in *.x86_64.cpp files, each with a *.portable.cpp twin that
// CMake compiles on every other architecture (RINGTRAIN_ARCH). A new
// `#include <immintrin.h>` in an ordinary source fails here, not on the first
// ARM machine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& p) {  // the whole file
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

TEST(Arch, X86CodeOnlyInX86Files) {
  const char* src = std::getenv("RINGTRAIN_SOURCE_DIR");  // set by CTest
  ASSERT_NE(src, nullptr);
  const fs::path root(src);
  ASSERT_TRUE(fs::exists(root / "CMakeLists.txt")) << root;
  const std::regex x86(R"(<(imm|xmm|emm|pmm|smm|nmm|x86|avx\w*)intrin\.h>|__builtin_cpu_supports|__builtin_ia32_)"
                       R"(|\b_mm(256|512)?_\w+\(|\b__m(128|256|512)[id]?\b|target\("(avx|sse|fma|f16c)|__x86_64__)");
  int x86_files = 0;
  for (const char* dir : {"src", "include", "cuda", "bench", "tests", "examples"})
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string name = e.path().filename().string();
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
      if (name == "arch_isolated.cpp") continue;  // this file names the patterns
      if (ends_with(name, ".x86_64.cpp")) {
        ++x86_files;
        const fs::path twin = e.path().parent_path() / (name.substr(0, name.size() - 11) + ".portable.cpp");
        EXPECT_TRUE(fs::exists(twin)) << e.path() << " has no portable twin " << twin.filename();
        continue;
      }
      std::istringstream text(read(e.path()));
      int n = 0;
      for (std::string line; std::getline(text, line);) {
        ++n;
        std::smatch m;
        EXPECT_FALSE(std::regex_search(line, m, x86))
            << e.path() << ":" << n << " uses x86-specific code ('" << m.str() << "'): move it to a *.x86_64.cpp "
            << "file with a *.portable.cpp twin (include/ringtrain/core/cpu.hpp)";
      }
    }
  EXPECT_GE(x86_files, 4) << "the scan found too few x86 files: test set-up";
}
