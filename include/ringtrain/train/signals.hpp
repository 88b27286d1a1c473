#pragma once
// Stop requests by signal. SIGTERM, SIGUSR1 and SIGINT (what Slurm and mpirun
// send at a time limit or preemption, and Ctrl-C) only set a flag; the trainer
// polls it at every step boundary, the ranks agree on it (it rides in the step's
// loss all-reduce, so a signal that reached one rank stops them all at the same
// step), and the run ends with a checkpoint at the exact position and exit
// status 75. A second signal while one is pending, 2 s or more after the first,
// ends the process at once with 128 + signo (nothing saved: the user insisted);
// an earlier one is the same stop delivered twice (a terminal's Ctrl-C reaches
// mpirun's whole process group, and mpirun forwards it as well).
namespace ringtrain {

class StopSignals {
 public:
  // Installs the handlers (process-wide: signal dispositions are per process,
  // hence the one static flag behind this class). Idempotent.
  static void install();
  // The signal number received and not yet cleared, or 0.
  static int pending();
  // Forgets a pending signal (tests run several stops in one process).
  static void clear();
  static const char* name(int signo);  // "SIGTERM", ...
};

}  // namespace ringtrain
