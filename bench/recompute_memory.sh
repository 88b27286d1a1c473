#!/usr/bin/env bash
# Peak RSS per rank and step time of train.recompute = none | attention | block
# on the CLI users run: vit (width 512, depth 8, 8 heads, patch 4: 49 tokens),
# batch 32, AdamW, one thread per rank, at 1 rank and pipeline 2 (1F1B, the
# default micro-batches), each under /usr/bin/time -v.
#   bench/recompute_memory.sh [BUILD_DIR] [STEPS] [ROUNDS]   (root: mpirun gets --allow-run-as-root)
# Step time: the trainer's cumulative img/s (JSON log) gives t_k = 32 k / ips_k;
# the mean of steps 2..STEPS is (t_STEPS - t_1) / (STEPS - 1), the first step
# (allocation, warm-up) left out. Peak RSS: the largest rank's "Maximum resident
# set size". ROUNDS runs of each mode, interleaved; the table shows the median.
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-4}
ROUNDS=${3:-2}
MPI=(mpirun --bind-to none --oversubscribe -x OMP_NUM_THREADS=1)
[[ $(id -u) == 0 ]] && MPI+=(--allow-run-as-root)
ARGS=(train --model vit --set model.width=512 --set model.depth=8 --set model.heads=8 --set model.patch=4
      --batch-size 32 --threads 1 --optimizer adamw --lr 1e-4 --no-eval --set log.format=json --set log.interval=1
      --set train.max_steps="$STEPS")
OUT=$(mktemp -d)
for round in $(seq "$ROUNDS"); do
  for layout in 1 2; do
    for mode in none attention block; do
      f=$OUT/$layout-$mode-$round
      if [[ $layout == 1 ]]; then
        /usr/bin/time -v -o "$f.time" "$BUILD/ringtrain" "${ARGS[@]}" --set train.recompute=$mode 2> "$f.log"
      else
        "${MPI[@]}" -np 2 /usr/bin/time -v -o "$f.time.%q{OMPI_COMM_WORLD_RANK}" "$BUILD/ringtrain" "${ARGS[@]}" \
          --set parallel.pipeline=2 --set train.recompute=$mode 2> "$f.log"
        cat "$f".time.* > "$f.time"
      fi
      echo "done: pipeline $layout, $mode, round $round" >&2
    done
  done
done
/usr/bin/python3 - "$OUT" "$STEPS" "$ROUNDS" <<'PY'
import json, re, statistics, sys
out, steps, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?')
print(f"CPU: {cpu}; {rounds} round(s) of {steps} steps, median shown")
print(f"{'layout':10} {'recompute':10} {'peak RSS MB':>11} {'x none':>7} {'step s':>7} {'x none':>7}  losses (last step, every round)")
for layout in ('1', '2'):
    base = {}
    for mode in ('none', 'attention', 'block'):
        rss, dt, loss = [], [], []
        for r in range(1, rounds + 1):
            f = f"{out}/{layout}-{mode}-{r}"
            kb = [int(m) for m in re.findall(r"Maximum resident set size \(kbytes\): (\d+)", open(f + '.time').read())]
            rss.append(max(kb) / 1024)
            ev = [json.loads(l) for l in open(f + '.log') if l.startswith('{"epoch"')]
            t = {e['step']: 32 * e['step'] / e['images_per_s'] for e in ev}
            dt.append((t[steps] - t[1]) / (steps - 1))
            loss.append(f"{ev[-1]['loss']:.10f}")
        m_rss, m_dt = statistics.median(rss), statistics.median(dt)
        base.setdefault('rss', m_rss); base.setdefault('dt', m_dt)
        name = '1 rank' if layout == '1' else 'pipeline 2'
        print(f"{name:10} {mode:10} {m_rss:11.0f} {m_rss / base['rss']:7.2f} {m_dt:7.2f} {m_dt / base['dt']:7.2f}  {' '.join(loss)}")
PY
