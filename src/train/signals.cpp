#include "ringtrain/train/signals.hpp"

#include <unistd.h>

#include <csignal>
#include <cstring>
#include <initializer_list>

namespace ringtrain {
namespace {

// The only state a signal handler may touch: a lock-free atomic flag.
volatile std::sig_atomic_t g_pending = 0;

extern "C" void on_stop_signal(int signo) {
  if (g_pending != 0) {
    // Second signal: the user insists. write() and _exit() are async-signal-safe.
    static const char msg[] = "ringtrain: second signal, exiting at once without a checkpoint\n";
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(128 + signo);
  }
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
