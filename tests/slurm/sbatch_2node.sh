#!/usr/bin/env bash
# CTest slurm/sbatch_2node: a 2-node sbatch of jobs/sbatch_fashion.sh on the test cluster trains
# across both emulated nodes and writes plain log lines, metrics and a checkpoint; then the same
# script with LAUNCHER=srun (srun --mpi=pmix) across both nodes.
# Usage: sbatch_2node.sh SRC_DIR RINGTRAIN_BIN   (run inside tests/slurm/cluster.sh run 2 -- ...)
set -uo pipefail
SRC=$1; BIN=$2
. "$(dirname "$0")/lib.sh"
WORK=$(mktemp -d /tmp/rt-slurm-2node.XXXXXX); trap 'rm -rf "$WORK"' EXIT
[ -f "$SRC/data/fashion-mnist/fashion-mnist-train.h5" ] ||
    "$BIN" prepare --dataset fashion-mnist --out "$SRC/data/fashion-mnist" >/dev/null || exit 1

# Site settings only: no GPUs, 1 CPU per rank, 1 rank per node; mpirun prints its process map.
export BIN CKPT_DIR=$WORK/ckpt OMPI_MCA_rmaps_base_display_map=1
# One whole epoch (the trainer writes its epoch summary and metrics record per whole epoch) of a
# small synthetic Fashion-MNIST-shaped set: 30 steps of 2 x 64 samples.
"$BIN" prepare --dataset synthetic --samples 3840 --test-samples 64 --channels 1 --height 28 --width 28 \
    --out "$WORK/data" > /dev/null || exit 1
id=$(submit -N 2 --ntasks-per-node=1 --cpus-per-task=1 --time=00:10:00 --output="$WORK/slurm-%j.out" \
     jobs/sbatch_fashion.sh --set data.train="$WORK/data" --set data.test="$WORK/data" --set train.epochs=1 \
     --set log.interval=10 --no-eval)
check "sbatch accepted the job ($id)" test -n "$id"
state=$(wait_job "$id" 300)
out=$WORK/slurm-$id.out
check "job $id completed (state $state)" test "$state" = COMPLETED
check "job ran on 2 nodes" test "$(job_field "$id" NumNodes)" = 2
check "mpirun placed a rank on node1" grep -qE 'Data for node: node1.*Num slots' "$out"
check "mpirun placed a rank on node2" grep -qE 'Data for node: node2.*Num slots' "$out"
check "trainer saw 2 ranks" grep -q 'on 2 rank(s)' "$out"
check "plain progress lines in the output" grep -qE '^epoch 1/1 step (10|20|30)/' "$out"
check "epoch summary in the output" grep -qE '^epoch 1/1: train loss [0-9.]+' "$out"
check "no terminal control characters in the output" bash -c "! grep -qP '\r|\x1b\[' '$out'"
check "script reported success" grep -q 'training finished' "$out"
check "metrics written" grep -q '"event":"epoch"' "$CKPT_DIR/metrics.jsonl"
check "metrics show 2 ranks" grep -q '"ranks":2' "$CKPT_DIR/metrics.jsonl"
check "checkpoint written" test -n "$(newest_ckpt "$CKPT_DIR")"
step=$(/usr/bin/python3 -c "import json;print([json.loads(l) for l in open('$CKPT_DIR/metrics.jsonl') if '\"epoch\"' in l][-1]['step'])")
check "trained one epoch of 30 steps (metrics say $step)" test "$step" = 30

# srun --mpi=pmix as the launcher across both nodes (each emulated node has its own TmpFS, where
# Slurm's PMIx plugin keeps its per-step directories).
export CKPT_DIR=$WORK/ckpt-srun
id=$(LAUNCHER=srun submit -N 2 --ntasks-per-node=1 --cpus-per-task=1 --time=00:10:00 --output="$WORK/slurm-%j.out" \
     jobs/sbatch_fashion.sh --set train.max_steps=10 --set train.epochs=1 --no-eval)
state=$(wait_job "$id" 300)
check "srun --mpi=pmix job $id completed (state $state)" test "$state" = COMPLETED
check "srun job ran on 2 nodes" test "$(job_field "$id" NumNodes)" = 2
check "srun started 2 ranks" grep -q 'on 2 rank(s)' "$WORK/slurm-$id.out"
check "srun job wrote a checkpoint" test -n "$(newest_ckpt "$CKPT_DIR")"
echo "1 passed, 0 failed"
