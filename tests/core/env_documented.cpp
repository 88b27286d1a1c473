// Every RINGTRAIN_* environment variable that the code under src/ and cuda/
// names is documented in README.md, docs/ or tests/gpu/README.md: a knob
// nobody can find is a knob nobody can use (or rule out when debugging).
// docs/environment.md's "Read" table is exactly what the code reads, and its
// "Removed" table exactly what the command line refuses (src/train/environment.cpp).
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

namespace {

// The variable names in the first cell of each table row under `heading` in environment.md.
std::set<std::string> table(const std::string& md, const std::string& heading) {
  std::set<std::string> out;
  const std::regex var(R"(RINGTRAIN_[A-Z0-9_]*[A-Z0-9])");
  std::istringstream in(md);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) inside = line == "## " + heading;
    if (!inside || line.rfind("| `", 0) != 0) continue;
    const std::string cell = line.substr(0, line.find(" | "));
    for (std::sregex_iterator it(cell.begin(), cell.end(), var), end; it != end; ++it) out.insert(it->str());
  }
  return out;
}

// Names matched by `re`'s first group in the .cpp/.hpp/.cu files under `dirs`.
std::set<std::string> scan(const fs::path& root, std::initializer_list<const char*> dirs, const std::regex& re) {
  std::set<std::string> out;
  for (const char* dir : dirs)
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".cu") continue;
      const std::string text = read(e.path());
      for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) out.insert((*it)[1].str());
    }
  return out;
}

std::string list(const std::set<std::string>& s) {
  std::string out;
  for (const auto& v : s) out += (out.empty() ? "" : ", ") + v;
  return out;
}

}  // namespace

TEST(Environment, TheReadTableIsWhatTheCodeReads) {
  const fs::path root = source_dir();
  ASSERT_TRUE(fs::exists(root / "docs/environment.md"));
  const std::set<std::string> documented = table(read(root / "docs/environment.md"), "Read");
  // A literal name passed to getenv (or environment.cpp's env helper).
  const std::set<std::string> read_by_code =
      scan(root, {"src", "cuda", "include", "tests/support"}, std::regex(R"re(\b(?:getenv|env)\("(RINGTRAIN_\w+)"\))re"));
  ASSERT_GE(read_by_code.size(), 4u) << "the scan found too few getenv calls: test set-up";
  EXPECT_EQ(documented, read_by_code) << "docs/environment.md's Read table: " << list(documented)
                                      << "\nread by the code: " << list(read_by_code);
}

TEST(Environment, TheRemovedTableIsWhatTheCommandLineRefuses) {
  const fs::path root = source_dir();
  const std::set<std::string> documented = table(read(root / "docs/environment.md"), "Removed");
  const std::set<std::string> refused =
      scan(root, {"src/train"}, std::regex(R"re(\{"(RINGTRAIN_\w+)", ")re"));
  ASSERT_GE(refused.size(), 10u) << "the scan found too few refused variables: test set-up";
  EXPECT_EQ(documented, refused) << "docs/environment.md's Removed table: " << list(documented)
                                 << "\nrefused by src/train/environment.cpp: " << list(refused);
  const std::set<std::string> read_by_code =
      scan(root, {"src", "cuda", "include"}, std::regex(R"re(\b(?:getenv|env)\("(RINGTRAIN_\w+)"\))re"));
  for (const auto& v : refused) EXPECT_EQ(read_by_code.count(v), 0u) << v << " is refused and read at once";
}
