#!/usr/bin/env bash
# mpirun as the documentation's commands use it: jobs/mpirun.sh -np N PROGRAM [ARGS...]
# It adds what a small machine, perhaps as root, needs so that the commands run as printed:
#   --bind-to none        ranks float over the cores (Open MPI otherwise pins them to one core each)
#   --oversubscribe       more ranks than cores is allowed (8 ranks on 2 cores run, slowly)
#   --allow-run-as-root   only when run as root
#   -x OMP_NUM_THREADS=1  one OpenMP thread per rank for programs that set none (ringtrain train: train.threads decides)
# HOSTFILE=FILE adds --hostfile FILE. MPIRUN_ARGS="..." adds further mpirun options.
# RT_MAX_STEPS=N appends `--set train.max_steps=N` to a `ringtrain train` command (the command-block
# test, tests/docs/command_blocks.sh, runs every documented command this way, briefly).
set -euo pipefail
args=(--bind-to none --oversubscribe -x "OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}")
[ "$(id -u)" = 0 ] && args+=(--allow-run-as-root)
[ -n "${HOSTFILE:-}" ] && args+=(--hostfile "$HOSTFILE")
# shellcheck disable=SC2206
[ -n "${MPIRUN_ARGS:-}" ] && args+=(${MPIRUN_ARGS})
tail=()
if [ -n "${RT_MAX_STEPS:-}" ]; then
  for a in "$@"; do [ "$a" = train ] && tail=(--set "train.max_steps=$RT_MAX_STEPS") && break; done
fi
exec mpirun "${args[@]}" "$@" "${tail[@]}"
