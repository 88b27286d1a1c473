#!/usr/bin/env bash
# CTest slurm/elastic: a 3-node job of jobs/sbatch_elastic.sh loses a node mid-run (every process of
# emulated node3 killed: its slurmd and its rank) and finishes on the 2 nodes left: the step is
# relaunched at 2 ranks from the last checkpoint with --resume auto, the final checkpoint's step
# count is the uninterrupted 3-node job's, the last loss matches it (the same global batch and
# data order: data.global_batch), and the lost steps are reported and at most
# checkpoint.every_steps. Usage: elastic.sh SRC_DIR RINGTRAIN_BIN (inside cluster.sh run 3 -- ...)
set -uo pipefail
SRC=$1; BIN=$2
. "$(dirname "$0")/lib.sh"
WORK=$(mktemp -d /tmp/rt-slurm-elastic.XXXXXX); trap 'rm -rf "$WORK"' EXIT
NODE3=${RT_SLURM_NAME:?}3   # node3's network namespace (cluster.sh)
STEPS=120 EVERY=20
export BIN PROBE_S=10 MAX_RELAUNCHES=2 MIN_NODES=2
"$BIN" prepare --dataset synthetic --samples 7680 --test-samples 64 --channels 1 --height 28 --width 28 \
    --out "$WORK/data" > /dev/null || exit 1
sb=(-N 3 --ntasks-per-node=1 --cpus-per-task=1 --time=00:10:00)
# Global batch 48: 16 per rank on 3 nodes, 24 on 2; 160 steps per epoch.
args=(--set data.train="$WORK/data" --set data.test="$WORK/data" --set data.global_batch=48
      --set train.epochs=1 --set train.max_steps=$STEPS --set comm.deterministic=true
      --set checkpoint.every_steps=$EVERY --set checkpoint.keep=20 --set log.interval=1 --no-eval)

ref=$(CKPT_DIR=$WORK/ref submit "${sb[@]}" --output="$WORK/ref-%j.out" jobs/sbatch_elastic.sh "${args[@]}")
check "reference job $ref completed" test "$(wait_job "$ref" 300)" = COMPLETED
check "reference trained on 3 ranks" grep -q 'launch 0: 3 rank(s) on 3 node(s)' "$WORK/ref-$ref.out"

id=$(CKPT_DIR=$WORK/run submit "${sb[@]}" --output="$WORK/run-%j.out" jobs/sbatch_elastic.sh "${args[@]}")
out=$WORK/run-$id.out
# Kill node3 once the job is past its second checkpoint and before its end.
end=$((SECONDS + 240))
until grep -qE "^epoch 1/1 step (4[5-9]|[5-9][0-9])/" "$out" 2>/dev/null || [ $SECONDS -ge $end ]; do sleep 0.1; done
check "job $id is training on 3 ranks" grep -q 'launch 0: 3 rank(s) on 3 node(s)' "$out"
pids=$(ip netns pids "$NODE3" | tr '\n' ' ')
check "node3 runs processes (slurmd and a rank)" test -n "$pids"
kill -9 $pids
at_kill=$(grep -oE '^epoch 1/1 step [0-9]+' "$out" | tail -1)
echo "killed node3 ($pids) at ${at_kill:-?}"
state=$(wait_job "$id" 400)
check "job $id completed on the nodes left (state $state)" test "$state" = COMPLETED
check "the script saw node3 lost" grep -qE 'step failed \(exit [0-9]+\); nodes alive: node1 node2; lost: node3' "$out"
check "relaunched at 2 ranks on node1 node2" grep -q 'launch 1: 2 rank(s) on 2 node(s) (node1 node2)' "$out"
check "the trainer logged the layout change" grep -qE 'checkpoint written at .*data 3 \(3 ranks\), continuing at .*data 2 \(2 ranks\)' "$out"
check "training finished" grep -q 'training finished after 1 relaunch' "$out"
ref_step=$(/usr/bin/python3 -c "import h5py,sys;print(h5py.File(sys.argv[1],'r')['scalars'].attrs['step'])" "$(newest_ckpt "$WORK/ref")")
run_step=$(/usr/bin/python3 -c "import h5py,sys;print(h5py.File(sys.argv[1],'r')['scalars'].attrs['step'])" "$(newest_ckpt "$WORK/run")")
check "final checkpoint at step $run_step = the uninterrupted job's $ref_step" test "$run_step" = "$ref_step" -a "$ref_step" = $STEPS
lost=$(sed -n 's/.*: \([0-9]*\) step(s) lost and trained again.*/\1/p' "$out" | tail -1)
check "lost steps reported (${lost:-none}) and at most checkpoint.every_steps = $EVERY" test -n "$lost" -a "${lost:-99}" -le $EVERY
last() { grep -E "^epoch 1/1 step $STEPS/" "$1" | tail -1 | awk '{print $6}'; }
check "last loss $(last "$out") follows the uninterrupted job's $(last "$WORK/ref-$ref.out") (2e-4)" \
    /usr/bin/python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 2e-4)" \
    "$(last "$out")" "$(last "$WORK/ref-$ref.out")"
echo "elastic: node3 killed at ${at_kill:-?}; $lost step(s) lost (checkpoint.every_steps = $EVERY); finished at step $run_step on 2 nodes"
echo "1 passed, 0 failed"
