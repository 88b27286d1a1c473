#!/usr/bin/env bash
# CTest slurm/elastic_srun: slurm/elastic (a node lost mid-run, the job finishes on the 2 left)
# with the job script launching its steps through srun (LAUNCHER=srun: pmix, --kill-on-bad-exit)
# instead of mpirun. Usage: elastic_srun.sh SRC_DIR RINGTRAIN_BIN (inside cluster.sh run 3 -- ...)
export LAUNCHER=srun
exec "$(dirname "$0")/elastic.sh" "$@"
