#!/usr/bin/env bash
# Runs every command block of README.md and docs/*.md, so that the documented commands cannot rot.
#   tests/docs/command_blocks.sh SOURCE_DIR BUILD_DIR [FILE.md...]     (ctest docs/command_blocks)
# Convention (README.md, "Commands in this documentation"):
#   ```sh            runnable: executed with bash -e -o pipefail, in document order, one scratch
#                    directory per file (build/, jobs/, data/fashion-mnist linked into it), with
#                    RT_MAX_STEPS=2 so that jobs/mpirun.sh caps every training run at 2 steps;
#   ```sh norun REASON   not executed (needs a cluster, root daemons, hours); REASON is required.
# Checks on every block: training goes through jobs/mpirun.sh (or jobs/mpirun_fashion.sh), never a
# bare `mpirun` (which fails as root and beyond the core count). docs/gpu.md is left out: its
# commands run on a GPU host (tests/gpu/run_on_gpu_host.sh). BLOCK_LOG_DIR=DIR keeps every block's output.
set -uo pipefail
SRC=$(cd "${1:?usage: command_blocks.sh SOURCE_DIR BUILD_DIR [FILE.md...]}" && pwd)
BUILD=$(cd "${2:?usage: command_blocks.sh SOURCE_DIR BUILD_DIR}" && pwd)
shift 2
BLOCK_TIMEOUT=${BLOCK_TIMEOUT:-300}
if [ $# -gt 0 ]; then files=("$@"); else
  files=("$SRC/README.md")
  for f in "$SRC"/docs/*.md; do [ "$(basename "$f")" = gpu.md ] || files+=("$f"); done
fi
[ -x "$BUILD/ringtrain" ] || { echo "command_blocks: no $BUILD/ringtrain"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

SCRATCH=$(mktemp -d /tmp/rt-docs-blocks.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
# One prepared Fashion-MNIST for every file, in the scratch directory (a block that prepares it
# again then never touches the source tree's copy).
DATA="$SCRATCH/fashion-mnist"
"$BUILD/ringtrain" prepare --dataset fashion-mnist --out "$DATA" </dev/null >/dev/null || { echo "command_blocks: prepare failed"; exit 1; }

# blocks FILE: "LINE<TAB>INFO" for every fenced block start, the body into $SCRATCH/b/<n>.sh
extract() {
  awk -v dir="$SCRATCH/b" '
    /^```/ && !inb { info=substr($0,4); inb=1; n++; start=NR; out=dir "/" n ".sh"; printf "" > out;
                     print start "\t" info; next }
    /^```/ && inb  { inb=0; close(out); next }
    inb            { print > out }' "$1"
}

fail=0; ran=0; skipped=0
# An indented fence (a block inside a list item) would escape the extraction below: refuse it.
for f in "${files[@]}"; do
  if grep -n '^[[:space:]]\+```' "$f" >/dev/null; then
    echo "FAIL ${f#"$SRC"/}:$(grep -n '^[[:space:]]\+```' "$f" | head -1 | cut -d: -f1): indented code fence; start fences in column 1"; fail=1
  fi
done
for f in "${files[@]}"; do
  rel=${f#"$SRC"/}
  rm -rf "$SCRATCH/b" "$SCRATCH/w"; mkdir -p "$SCRATCH/b" "$SCRATCH/w/data"
  ln -s "$BUILD" "$SCRATCH/w/build"; ln -s "$SRC/jobs" "$SCRATCH/w/jobs"; ln -s "$SRC/Makefile" "$SCRATCH/w/Makefile"
  ln -s "$SRC/examples" "$SCRATCH/w/examples"
  ln -s "$DATA" "$SCRATCH/w/data/fashion-mnist"
  n=0
  while IFS=$'\t' read -r line info; do
    n=$((n + 1)); body="$SCRATCH/b/$n.sh"
    lang=${info%% *}
    case $lang in sh|bash) ;; *) continue ;; esac   # text, toml, ... blocks are not commands
    # Joined continuation lines, comments dropped: what the shell will see.
    joined=$(sed -e 's/[[:space:]]#.*$//' -e 's/^#.*$//' "$body" | sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta')
    if grep -Eq '(^|[;&|(])[[:space:]]*mpirun[[:space:]]' <<<"$joined"; then
      echo "FAIL $rel:$line: a bare 'mpirun' (fails as root and beyond the core count): use jobs/mpirun.sh"; fail=1
    fi
    if [[ " $info " == *" norun"* ]]; then
      reason=${info#*norun}; reason=${reason# }
      if [ -z "$reason" ]; then echo "FAIL $rel:$line: 'norun' without a reason"; fail=1; fi
      echo "skip $rel:$line ($reason)"; skipped=$((skipped + 1)); continue
    fi
    if grep -E 'ringtrain train' <<<"$joined" | grep -Ev 'jobs/mpirun(_fashion)?\.sh|--print-config|--print-plan|--print-schedule|--list-keys|--help' | grep -q .; then
      echo "FAIL $rel:$line: 'ringtrain train' outside jobs/mpirun.sh: RT_MAX_STEPS cannot cap it"; fail=1; continue
    fi
    start=$(date +%s)
    (cd "$SCRATCH/w" && RT_MAX_STEPS=2 timeout -k 10 "$BLOCK_TIMEOUT" bash -e -o pipefail "$body") < /dev/null > "$SCRATCH/log" 2>&1
    rc=$?; ran=$((ran + 1))
    [ -n "${BLOCK_LOG_DIR:-}" ] && cp "$SCRATCH/log" "$BLOCK_LOG_DIR/$(basename "$rel" .md)-$line.log"
    if [ $rc -ne 0 ]; then
      echo "FAIL $rel:$line: exit status $rc after $(( $(date +%s) - start )) s; the block:"
      sed 's/^/    | /' "$body"
      echo "  its output (last 40 lines):"; tail -40 "$SCRATCH/log" | sed 's/^/    > /'
      fail=1
    else
      echo "ok   $rel:$line ($(( $(date +%s) - start )) s)"
    fi
  done < <(extract "$f")
done
echo "command_blocks: $ran block(s) run, $skipped marked norun, in ${#files[@]} file(s)"
[ $ran -gt 0 ] || { echo "command_blocks: no runnable block found"; fail=1; }
exit $fail
