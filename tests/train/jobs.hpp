#pragma once
// Launching real jobs from a test: mpirun of a child test or of `ringtrain`,
// with the exit status, the wall time and the output.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

namespace ringtrain::test_jobs {

namespace fs = std::filesystem;

struct JobResult {
  int status = -1;  // exit status (128+n when killed by signal n)
  double seconds = 0;
  std::string out;
};

inline JobResult run_job(const std::string& cmd) {
  // A clean environment: this process is itself an MPI singleton, whose
  // variables must not leak into the child mpirun.
  std::string full = "env -i PATH=\"$PATH\" HOME=\"$HOME\" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                     "OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 "
                     "RINGTRAIN_TEST_WATCHDOG=120 " + cmd + " 2>&1";
  auto t0 = std::chrono::steady_clock::now();
  JobResult r;
  FILE* f = popen(full.c_str(), "r");
  if (!f) return r;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), f)) r.out += buf.data();
  int st = pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

inline std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

inline std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }
inline std::string ringtrain_exe() { return (fs::path(self_exe()).parent_path().parent_path() / "ringtrain").string(); }
inline std::string mpirun(int np) { return "mpirun -np " + std::to_string(np) + " --oversubscribe --bind-to none "; }


}  // namespace ringtrain::test_jobs
