#!/usr/bin/env bash
# The largest rank's peak RSS at 4 ranks against 1 rank with no memory feature,
# for the layouts that exist to save memory, on the CLI users run: vit (width
# 512, depth 8, 8 heads), global batch 32, one thread per rank, every process
# under /usr/bin/time -v. Printed beside each layout's goal (issue 30):
#   tensor 4 + sequence parallelism, recompute block   <= 0.30
#   pipeline 4 (parameters balanced), recompute block  <= 0.30
#   ZeRO-3 over 4, recompute block                     <= 0.30
#   ZeRO-3 over 4, no recomputation                    <= 0.45
# Sequence parallelism needs tokens that 4 divides: those rows and their 1-rank
# base use patch 2 (196 tokens), the others patch 4 (49 tokens).
#   bench/memory_goals.sh [BUILD_DIR] [OPTIMIZER] [STEPS]   (root: mpirun gets --allow-run-as-root)
set -euo pipefail
BUILD=${1:-build}
OPT=${2:-adamw}
STEPS=${3:-2}
MPI=(mpirun --bind-to none --oversubscribe -x OMP_NUM_THREADS=1)
[[ $(id -u) == 0 ]] && MPI+=(--allow-run-as-root)
ARGS=(train --model vit --set model.width=512 --set model.depth=8 --set model.heads=8 --set data.global_batch=32
      --threads 1 --optimizer "$OPT" --lr 1e-4 --no-eval --set train.max_steps="$STEPS" --set checkpoint.dir=)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# name | ranks | patch | settings
rows=(
  "base-p4|1|4|"
  "base-p2|1|2|"
  "tensor4+seq, block|4|2|--set parallel.tensor=4 --set parallel.sequence=true --set train.recompute=block"
  "tensor4+seq, none|4|2|--set parallel.tensor=4 --set parallel.sequence=true"
  "pipeline4, block|4|4|--set parallel.pipeline=4 --set parallel.partition=params --set train.recompute=block"
  "pipeline4, none|4|4|--set parallel.pipeline=4 --set parallel.partition=params"
  "zero3x4, block|4|4|--set parallel.zero=3 --set train.recompute=block"
  "zero3x4, none|4|4|--set parallel.zero=3"
)
i=0
for row in "${rows[@]}"; do
  IFS='|' read -r name np patch extra <<< "$row"
  f=$OUT/$i
  # One time file per rank (its world rank from Open MPI's environment).
  # shellcheck disable=SC2086
  "${MPI[@]}" -np "$np" bash -c '/usr/bin/time -v -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$f.time" \
    "$BUILD/ringtrain" "${ARGS[@]}" --set model.patch="$patch" $extra > "$f.log" 2>&1
  echo "$name" > "$f.name"
  echo "done: $name" >&2
  i=$((i + 1))
done
/usr/bin/python3 - "$OUT" "$i" "$OPT" <<'PY'
import glob, re, sys
out, n, opt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?')
def peak(k):
    return max(float(re.search(r'Maximum resident set size \(kbytes\): (\d+)', open(t).read()).group(1)) / 1024
               for t in glob.glob(f"{out}/{k}.time.*"))
names = [open(f"{out}/{k}.name").read().strip() for k in range(n)]
rss = {names[k]: peak(k) for k in range(n)}
goals = {"tensor4+seq, block": 0.30, "pipeline4, block": 0.30, "zero3x4, block": 0.30, "zero3x4, none": 0.45}
print(f"CPU: {cpu}; vit 512 x 8, global batch 32, optimizer {opt}; largest rank's peak RSS")
print(f"{'layout (4 ranks)':22} {'patch':>5} {'peak RSS MB':>11} {'1 rank MB':>9} {'x 1 rank':>8} {'goal':>6}")
for name in names:
    if name.startswith("base"):
        continue
    base = rss["base-p2" if name.startswith("tensor") else "base-p4"]
    g = goals.get(name)
    print(f"{name:22} {2 if name.startswith('tensor') else 4:5d} {rss[name]:11.0f} {base:9.0f} {rss[name] / base:8.3f} "
          f"{('<= %.2f' % g) if g else '':>8}" + (("  met" if rss[name] / base <= g else "  NOT met") if g else ""))
PY
