#!/usr/bin/env bash
# CTest slurm/elastic: a 3-node job of jobs/sbatch_elastic.sh loses a node mid-run (every process of
# emulated node3 killed: its slurmd and its rank) and finishes on the 2 nodes left: the step is
# relaunched at 2 ranks from the last checkpoint with --resume auto, the final checkpoint's step
# count is the uninterrupted 3-node job's, every loss after the resumed step matches its (the same global batch and
# data order: data.global_batch), and the relaunch resumes from the newest checkpoint that was
# complete when the node died (an asynchronous write still in flight then is not one), so the lost
# steps are reported and fewer than 2 x checkpoint.every_steps. Usage: elastic.sh SRC_DIR RINGTRAIN_BIN (inside cluster.sh run 3 -- ...)
set -uo pipefail
SRC=$1; BIN=$2
. "$(dirname "$0")/lib.sh"
WORK=$(mktemp -d /tmp/rt-slurm-elastic.XXXXXX); trap 'rm -rf "$WORK"' EXIT
NODE3=${RT_SLURM_NAME:?}3   # node3's network namespace (cluster.sh)
STEPS=400 EVERY=20
export BIN PROBE_S=10 MAX_RELAUNCHES=2 MIN_NODES=2
[ -f "$SRC/data/fashion-mnist/fashion-mnist-train.h5" ] ||
    "$BIN" prepare --dataset fashion-mnist --out "$SRC/data/fashion-mnist" >/dev/null || exit 1
sb=(-N 3 --ntasks-per-node=1 --cpus-per-task=1 --time=00:10:00)
# `mlp` + AdamW on Fashion-MNIST, global batch 48: 16 per rank on 3 nodes, 24 on 2. (With the
# README's `cnn` + SGD at lr 0.05 and momentum 0.9 the rounding differences of the other sum order
# grow to ~1e-2 in the loss after 80 steps: that trajectory is chaotic, not wrong.)
args=(--set model.name=mlp --set optimizer.name=adamw --set optimizer.nesterov=false --set optimizer.lr=0.001
      --set data.global_batch=48 --set train.epochs=1 --set train.max_steps=$STEPS --set comm.deterministic=true
      --set checkpoint.every_steps=$EVERY --set checkpoint.keep=20 --set log.interval=1 --no-eval)

ref=$(CKPT_DIR=$WORK/ref submit "${sb[@]}" --output="$WORK/ref-%j.out" jobs/sbatch_elastic.sh "${args[@]}")
check "reference job $ref completed" test "$(wait_job "$ref" 300)" = COMPLETED
check "reference trained on 3 ranks" grep -q 'launch 0: 3 rank(s) on 3 node(s)' "$WORK/ref-$ref.out"

id=$(CKPT_DIR=$WORK/run submit "${sb[@]}" --output="$WORK/run-%j.out" jobs/sbatch_elastic.sh "${args[@]}")
out=$WORK/run-$id.out
# Kill node3 once the job is past its second checkpoint and before its end.
end=$((SECONDS + 240))
until grep -qE "^epoch 1/1 step (4[5-9]|[5-9][0-9]|[1-3][0-9][0-9])/" "$out" 2>/dev/null || [ $SECONDS -ge $end ]; do sleep 0.05; done
check "job $id is training on 3 ranks" grep -q 'launch 0: 3 rank(s) on 3 node(s)' "$out"
pids=$(ip netns pids "$NODE3" | tr '\n' ' ')
check "node3 runs processes (slurmd and a rank)" test -n "$pids"
# The newest checkpoint complete before the kill: the relaunch may resume from none older.
done_before=$(sed -n 's/.*checkpoint written: .*-s0*\([0-9][0-9]*\)\.h5.*/\1/p' "$out" | tail -1)
kill -9 $pids
at_kill=$(grep -oE '^epoch 1/1 step [0-9]+' "$out" | tail -1)
echo "killed node3 ($pids) at ${at_kill:-?}"
state=$(wait_job "$id" 400)
check "job $id completed on the nodes left (state $state)" test "$state" = COMPLETED
check "the script saw node3 lost" grep -qE 'step failed \(exit [0-9]+\); nodes alive: node1 node2; lost: node3' "$out"
check "relaunched at 2 ranks on node1 node2 via ${LAUNCHER:-mpirun}" \
    grep -q "launch 1: 2 rank(s) on 2 node(s) (node1 node2) via ${LAUNCHER:-mpirun}" "$out"
check "the trainer logged the layout change" grep -qE 'checkpoint written at .*data 3 \(3 ranks\), continuing at .*data 2 \(2 ranks\)' "$out"
check "training finished" grep -q 'training finished after 1 relaunch' "$out"
ref_step=$(/usr/bin/python3 -c "import h5py,sys;print(h5py.File(sys.argv[1],'r')['scalars'].attrs['step'])" "$(newest_ckpt "$WORK/ref")")
run_step=$(/usr/bin/python3 -c "import h5py,sys;print(h5py.File(sys.argv[1],'r')['scalars'].attrs['step'])" "$(newest_ckpt "$WORK/run")")
check "final checkpoint at step $run_step = the uninterrupted job's $ref_step" test "$run_step" = "$ref_step" -a "$ref_step" = $STEPS
lost=$(sed -n 's/.*: \([0-9]*\) step(s) lost and trained again.*/\1/p' "$out" | tail -1)
resumed=$(sed -n 's/.*launch 1 resumed at step \([0-9]*\);.*/\1/p' "$out")
check "resumed at step ${resumed:-none}, not before the newest checkpoint complete at the kill (${done_before:-none})" \
    test -n "$resumed" -a -n "$done_before" -a "${resumed:-0}" -ge "${done_before:-1}"
# A save waits for the previous asynchronous write, so a checkpoint is in flight for fewer than
# every_steps steps: the work lost is below twice the interval.
check "lost steps reported (${lost:-none}) and below 2 x checkpoint.every_steps = $((2 * EVERY))" test -n "$lost" -a "${lost:-99}" -lt $((2 * EVERY))
# Every step's loss from the resumed step on, against the uninterrupted job's (the last line of
# a step wins: the relaunch logs again the steps it recomputes).
losses() { sed -n 's/^epoch 1\/1 step \([0-9]*\)\/[0-9]* loss \([0-9.]*\) .*/\1 \2/p' "$1"; }
cmp=$(/usr/bin/python3 - "$resumed" <(losses "$WORK/ref-$ref.out") <(losses "$out") <<'EOF'
import sys
start = int(sys.argv[1] or 10**9)
ref, run = (dict(l.split() for l in open(p)) for p in sys.argv[2:4])
steps = [s for s in map(str, range(start + 1, 10**5)) if s in ref]
diff = max((abs(float(ref[s]) - float(run.get(s, "inf"))) for s in steps), default=float("inf"))
print(len(steps), diff, ref[steps[-1]] if steps else "?")
EOF
)
read -r n diff last_loss <<< "$cmp"
check "the $n losses after resuming (to $last_loss) follow the uninterrupted job's: max difference $diff <= 2e-4" \
    /usr/bin/python3 -c "import sys; sys.exit(not (int(sys.argv[1]) >= 200 and float(sys.argv[2]) <= 2e-4 and float(sys.argv[3]) > 0.05))" \
    "$n" "$diff" "$last_loss"
grep -E '^\[sbatch_elastic|continuing at' "$out"
echo "elastic: node3 killed at ${at_kill:-?}; $lost step(s) lost (checkpoint.every_steps = $EVERY); finished at step $run_step on 2 nodes"
echo "1 passed, 0 failed"
