#!/usr/bin/env bash
# Slurm job: one rank per GPU (or per socket on CPU nodes), Fashion-MNIST `cnn`.
#   sbatch jobs/sbatch_fashion.sh                      (2 nodes × 4 ranks)
#   sbatch -N 4 --ntasks-per-node=4 jobs/sbatch_fashion.sh --set train.epochs=20
#SBATCH --job-name=ringtrain-fashion
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --gpus-per-node=4
#SBATCH --time=00:30:00
#SBATCH --output=runs/slurm-%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
BIN=${BIN:-build/ringtrain}
CONFIG=${CONFIG:-jobs/fashion_cnn.toml}
# Prepare once, before the parallel step (a no-op when the files exist).
[ -f data/fashion-mnist/fashion-mnist-train.h5 ] || "$BIN" prepare --dataset fashion-mnist --out data/fashion-mnist
# ringtrain selects the GPU by node-local rank; srun starts the MPI ranks (PMIx).
# Log lines are plain (no terminal); metrics go to the checkpoint directory.
srun --mpi=pmix --cpu-bind=cores "$BIN" train --config "$CONFIG" \
  --set checkpoint.dir="runs/fashion-${SLURM_JOB_ID}" "$@"
