#include "ringtrain/train/signals.hpp"

#include <time.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <initializer_list>

namespace ringtrain {
namespace {

constexpr long kRepeatS = 2;  // a repeat within this many seconds is the same stop

// The only state a signal handler may touch: lock-free flags.
volatile std::sig_atomic_t g_pending = 0;
volatile std::sig_atomic_t g_first_s = 0;  // CLOCK_MONOTONIC seconds of the first signal

long now_s() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return static_cast<long>(t.tv_sec);
}

extern "C" void on_stop_signal(int signo) {
  // One stop often arrives twice within a moment (Ctrl-C reaches mpirun's whole
  // process group, and mpirun forwards it too): only a signal at least a second
  // after the first counts as the user insisting.
  if (g_pending != 0 && now_s() - g_first_s >= kRepeatS) {
    // Second signal: the user insists. write() and _exit() are async-signal-safe.
    static const char msg[] = "ringtrain: second signal, exiting at once without a checkpoint\n";
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(128 + signo);
  }
  if (g_pending != 0) return;
  g_first_s = static_cast<std::sig_atomic_t>(now_s());
  g_pending = signo;
}

}  // namespace

void StopSignals::install() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls in MPI and HDF5 continue; the flag is polled
  for (int s : {SIGTERM, SIGUSR1, SIGINT}) sigaction(s, &sa, nullptr);
}

int StopSignals::pending() { return g_pending; }
void StopSignals::clear() { g_pending = 0; }

const char* StopSignals::name(int signo) {
  switch (signo) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGINT: return "SIGINT";
    default: return "signal";
  }
}

}  // namespace ringtrain
