#!/usr/bin/env bash
# The command-block test must fail when a command breaks: feed it pages with one defect each
# and expect exit 1 with the defect named; a clean page must pass.
#   tests/docs/command_blocks_selftest.sh SOURCE_DIR BUILD_DIR      (ctest docs/command_blocks_selftest)
set -uo pipefail
SRC=$1; BUILD=$2
T=$(mktemp -d /tmp/rt-docs-selftest.XXXXXX)
trap 'rm -rf "$T"' EXIT
fence='```'
page() { printf '# page\n\n%s%s\n%s\n%s\n' "$fence" "$1" "$2" "$fence" > "$T/$3.md"; }
page sh 'build/ringtrain train --list-keys > keys.txt && grep -q model.name keys.txt' good
page sh 'false' fails
page sh 'mpirun -np 2 build/ringtrain train --config jobs/fashion_cnn.toml' bare_mpirun
page sh 'build/ringtrain train --config jobs/fashion_cnn.toml' uncapped
page 'sh norun' 'make cluster-up' no_reason
page sh 'jobs/mpirun.sh -np 2 build/ringtrain train --config jobs/fashion_cnn.toml --set model.name=nope' bad_key
printf '# page\n\n- a list item\n\n  %ssh\n  echo hidden\n  %s\n' "$fence" "$fence" > "$T/indented.md"
status=0
expect() {  # expect NAME RC PATTERN
  out=$("$SRC/tests/docs/command_blocks.sh" "$SRC" "$BUILD" "$T/$1.md" 2>&1); rc=$?
  if [ "$rc" != "$2" ] || ! grep -q -- "$3" <<<"$out"; then
    echo "FAIL: page '$1': expected exit $2 and '$3', got exit $rc:"; sed 's/^/    /' <<<"$out"; status=1
  else echo "ok: page '$1' -> exit $rc, '$3'"; fi
}
expect good 0 "1 block(s) run"
expect fails 1 "exit status 1"
expect bare_mpirun 1 "a bare 'mpirun'"
expect uncapped 1 "outside jobs/mpirun.sh"
expect no_reason 1 "'norun' without a reason"
expect bad_key 1 "model.name"
expect indented 1 "indented code fence"
exit $status
