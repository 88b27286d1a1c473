#pragma once
// Input files written by an independent program: NumPy under Debian's
// /usr/bin/python3, in a fresh temporary directory per test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace ringtrain::test_support {

// A fresh, empty directory under /tmp named by prefix, tag and this process.
inline std::filesystem::path temp_dir(const std::string& prefix, const std::string& tag) {
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() / (prefix + "-" + tag + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Runs `code` (with numpy as np, os, sys imported) inside dir.
inline void python(const std::filesystem::path& dir, const std::string& code) {
  const std::filesystem::path script = dir / "gen.py";
  std::ofstream(script) << "import numpy as np, os, sys\nos.chdir(sys.argv[1])\n" << code;
  const std::string cmd = "/usr/bin/python3 " + script.string() + " " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace ringtrain::test_support
