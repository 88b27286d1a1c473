#!/usr/bin/env bash
# The sharded resume against the resume before it (rank 0 read every part,
# assembled the whole state and broadcast it): per rank, the peak RSS while
# training and while resuming, and the resume time, at 4 ranks.
#   bench/train_resume.sh BEFORE AFTER [CSV]
# BEFORE, AFTER: bench_train_resume (bench/train_resume.cpp) built against the
# two trees; the source compiles against both. To build the one before, at
# commit C:
#   mkdir -p build-ref/tree && git archive C | tar -x -C build-ref/tree
#   cp bench/train_resume.cpp build-ref/tree/bench/
#   cmake -S build-ref/tree -B build-ref/tree/build -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-ref/tree/build -j 2 --target bench_train_resume
# vit (width 512, depth 8, 8 heads; 25 M parameters, AdamW: 303 MB of state),
# global batch 32, one thread per rank, at pipeline 4 and at tensor 4; each
# resumes the checkpoint its layout wrote, and tensor 4 also pipeline 4's
# (resharding). The checkpoints are written once (by AFTER, the same format)
# and read from the page cache. Resume times: the median of REPS (default 3)
# runs per build, interleaved. Floor: every rank reading 1/4 of the
# checkpoint's bytes at once, the I/O a sharded read cannot avoid.
set -euo pipefail
BEFORE=${1:?usage: bench/train_resume.sh BEFORE AFTER [CSV]}
AFTER=${2:?usage: bench/train_resume.sh BEFORE AFTER [CSV]}
CSV=${3:-docs/data/train_resume.csv}
REPS=${REPS:-3}
MPI=(mpirun --bind-to none --oversubscribe -x OMP_NUM_THREADS=1)
[[ $(id -u) == 0 ]] && MPI+=(--allow-run-as-root)
DIR=$(mktemp -d "${TMPDIR:-/tmp}/ringtrain-resume-XXXXXX")
trap 'rm -rf "$DIR"' EXIT
mkdir -p "$(dirname "$CSV")"
echo "build,phase,layout,from,rank,peak_rss_mb,seconds,floor_s" > "$CSV"
run() {  # build-label binary np args...
  local label=$1 bin=$2 np=$3
  shift 3
  echo "== $label: $np rank(s) $*" >&2
  "${MPI[@]}" -np "$np" "$bin" --dir "$DIR" "$@" | sed "s/^/$label,/" >> "$CSV"
}
"${MPI[@]}" -np 1 "$AFTER" --dir "$DIR" --phase prepare
for layout in "4 1" "1 4"; do
  set -- $layout
  L=(--pipeline "$1" --tensor "$2")
  run before "$BEFORE" 4 --phase train "${L[@]}"
  run after "$AFTER" 4 --phase train "${L[@]}"
  run after "$AFTER" 4 --phase write "${L[@]}"
done
for rep in $(seq "$REPS"); do
  for from_to in "p4t1 4 1" "p1t4 1 4" "p4t1 1 4"; do
    set -- $from_to
    run before "$BEFORE" 4 --phase resume --from "$1" --pipeline "$2" --tensor "$3"
    run after "$AFTER" 4 --phase resume --from "$1" --pipeline "$2" --tensor "$3"
  done
done
/usr/bin/python3 - "$CSV" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?')
print(f"CPU: {cpu} ({sum(1 for l in open('/proc/cpuinfo') if l.startswith('processor'))} logical); CSV: {sys.argv[1]}")
name = {'p4t1': 'pipeline 4', 'p1t4': 'tensor 4'}
def sel(**kw): return [r for r in rows if all(r[k] == v for k, v in kw.items())]
print("\npeak RSS per rank (MB): training vs resuming; goal: resume <= 1.05 x training")
print(f"{'resume':24} {'rank':>4} {'train':>7} {'before':>7} {'x train':>8} {'after':>7} {'x train':>8} {'goal':>5}")
for frm, to in (('p4t1', 'p4t1'), ('p1t4', 'p1t4'), ('p4t1', 'p1t4')):
    for rank in range(4):
        tr = max(float(r['peak_rss_mb']) for r in sel(build='after', phase='train', layout=to, rank=str(rank)))
        b = max(float(r['peak_rss_mb']) for r in sel(build='before', phase='resume', layout=to, rank=str(rank), **{'from': frm}))
        a = max(float(r['peak_rss_mb']) for r in sel(build='after', phase='resume', layout=to, rank=str(rank), **{'from': frm}))
        label = name[to] + ('' if frm == to else f' from {name[frm]}')
        print(f"{label:24} {rank:4d} {tr:7.0f} {b:7.0f} {b / tr:8.2f} {a:7.0f} {a / tr:8.2f} {1.05:5.2f}")
print("\nresume time at 4 ranks (s, median of the runs; the slowest rank); goal: after <= 0.5 x before")
print(f"{'resume':24} {'before':>8} {'after':>8} {'after/before':>12} {'goal':>5} {'floor':>7}  runs before | after")
for frm, to in (('p4t1', 'p4t1'), ('p1t4', 'p1t4'), ('p4t1', 'p1t4')):
    t = {b: [float(r['seconds']) for r in sel(build=b, phase='resume', layout=to, rank='0', **{'from': frm})] for b in ('before', 'after')}
    fl = statistics.median(float(r['floor_s']) for r in sel(build='after', phase='resume', layout=to, rank='0', **{'from': frm}))
    mb, ma = statistics.median(t['before']), statistics.median(t['after'])
    label = name[to] + ('' if frm == to else f' from {name[frm]}')
    print(f"{label:24} {mb:8.3f} {ma:8.3f} {ma / mb:12.2f} {0.5:5.2f} {fl:7.3f}  "
          f"{' '.join(f'{x:.2f}' for x in t['before'])} | {' '.join(f'{x:.2f}' for x in t['after'])}")
PY
