// Every RINGTRAIN_* environment variable that the code under src/ and cuda/
// names is documented in README.md, docs/ or tests/gpu/README.md: a knob
// nobody can find is a knob nobody can use (or rule out when debugging).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path source_dir() {
  const char* s = std::getenv("RINGTRAIN_SOURCE_DIR");  // set by CTest
  return s ? fs::path(s) : fs::path();
}

}  // namespace

TEST(Environment, EveryVariableTheCodeReadsIsDocumented) {
  const fs::path root = source_dir();
  ASSERT_TRUE(fs::exists(root / "README.md")) << "RINGTRAIN_SOURCE_DIR=" << root << " is not the source tree";
  const std::regex var(R"(RINGTRAIN_[A-Z0-9_]*[A-Z0-9])");
  std::set<std::string> used;
  for (const char* dir : {"src", "cuda", "include"})
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".cuh") continue;
      const std::string text = read(e.path());
      for (std::sregex_iterator it(text.begin(), text.end(), var), end; it != end; ++it) used.insert(it->str());
    }
  // Not environment variables: CMake options and compile definitions.
  for (const char* notenv : {"RINGTRAIN_CUDA", "RINGTRAIN_CUDA_ARCH", "RINGTRAIN_HAVE_CUDA", "RINGTRAIN_SOURCE_DIR"})
    used.erase(notenv);
  ASSERT_GT(used.size(), 10u) << "the scan found too few variables: test set-up";

  std::string docs = read(root / "README.md") + read(root / "tests/gpu/README.md");
  if (fs::exists(root / "docs"))
    for (const auto& e : fs::recursive_directory_iterator(root / "docs"))
      if (e.path().extension() == ".md") docs += read(e.path());
  for (const auto& v : used)
    EXPECT_NE(docs.find("`" + v), std::string::npos) << v << " is read by the code but documented nowhere";
}
