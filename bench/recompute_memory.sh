#!/usr/bin/env bash
# Peak RSS per rank and step cost of train.recompute = none | attention | block
# on the CLI users run: vit (width 512, depth 8, 8 heads, patch 4: 49 tokens),
# batch 32, AdamW, one thread per rank, at 1 rank and pipeline 2 (1F1B, the
# default 2 micro-batches), every process under /usr/bin/time -v.
#   bench/recompute_memory.sh [BUILD_DIR] [STEPS]   (root: mpirun gets --allow-run-as-root)
# Each setting runs twice, for 1 and for STEPS steps:
#  - peak RSS: the largest rank's "Maximum resident set size" of the STEPS run;
#  - CPU s/step: (user + sys of the STEPS run - that of the 1-step run) / (STEPS - 1),
#    summed over the ranks: the cost of steps 2..STEPS, start-up and the first
#    step (allocation, warm-up) left out, and insensitive to other load on the machine;
#  - wall s/step: from the trainer's cumulative img/s (JSON log), t_k = 32 k / ips_k,
#    (t_STEPS - t_1) / (STEPS - 1): what a user waits, noisy on a shared machine.
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-4}
MPI=(mpirun --bind-to none --oversubscribe -x OMP_NUM_THREADS=1)
[[ $(id -u) == 0 ]] && MPI+=(--allow-run-as-root)
ARGS=(train --model vit --set model.width=512 --set model.depth=8 --set model.heads=8 --set model.patch=4
      --batch-size 32 --threads 1 --optimizer adamw --lr 1e-4 --no-eval --set log.format=json --set log.interval=1)
OUT=$(mktemp -d)
for layout in 1 2; do
  for mode in none attention block; do
    for steps in 1 "$STEPS"; do
      f=$OUT/$layout-$mode-$steps
      if [[ $layout == 1 ]]; then
        /usr/bin/time -v -o "$f.time.0" "$BUILD/ringtrain" "${ARGS[@]}" --set train.max_steps="$steps" \
          --set train.recompute=$mode 2> "$f.log"
      else
        # One time file per rank (its world rank from Open MPI's environment).
        "${MPI[@]}" -np 2 bash -c '/usr/bin/time -v -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$f.time" \
          "$BUILD/ringtrain" "${ARGS[@]}" --set train.max_steps="$steps" --set parallel.pipeline=2 \
          --set train.recompute=$mode 2> "$f.log"
      fi
      echo "done: pipeline $layout, $mode, $steps step(s)" >&2
    done
  done
done
/usr/bin/python3 - "$OUT" "$STEPS" <<'PY'
import glob, json, re, sys
out, steps = sys.argv[1], int(sys.argv[2])
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?')
def times(f):  # per rank: (peak RSS MB, user + sys s)
    r = []
    for t in sorted(glob.glob(f + '.time.*')):
        s = open(t).read()
        g = lambda k: float(re.search(k + r': ([\d.]+)', s).group(1))
        r.append((g(r'Maximum resident set size \(kbytes\)') / 1024, g(r'User time \(seconds\)') + g(r'System time \(seconds\)')))
    return r
print(f"CPU: {cpu}; runs of 1 and {steps} steps per setting")
print(f"{'layout':10} {'recompute':10} {'peak RSS MB per rank':>22} {'max x none':>10} {'CPU s/step':>10} {'x none':>6} {'wall s/step':>11} {'x none':>6}  final loss")
for layout in ('1', '2'):
    base = None
    for mode in ('none', 'attention', 'block'):
        f = f"{out}/{layout}-{mode}"
        long, short = times(f"{f}-{steps}"), times(f"{f}-1")
        rss = [r for r, _ in long]
        cpu_step = (sum(c for _, c in long) - sum(c for _, c in short)) / (steps - 1)
        ev = [json.loads(l) for l in open(f"{f}-{steps}.log") if l.startswith('{"epoch"')]
        t = {e['step']: 32 * e['step'] / e['images_per_s'] for e in ev}
        wall = (t[steps] - t[1]) / (steps - 1)
        if base is None: base = (max(rss), cpu_step, wall)
        name = '1 rank' if layout == '1' else 'pipeline 2'
        print(f"{name:10} {mode:10} {' / '.join(f'{r:.0f}' for r in rss):>22} {max(rss) / base[0]:10.2f} "
              f"{cpu_step:10.2f} {cpu_step / base[1]:6.2f} {wall:11.2f} {wall / base[2]:6.2f}  {ev[-1]['loss']:.12f}")
PY
