#!/usr/bin/env bash
# The README's test command, N times, on a fresh clone of HEAD: how often a new user's run is green.
#   scripts/repeat-tests.sh                 # 5 runs, idle machine
#   scripts/repeat-tests.sh --runs 3 --load # 3 runs beside two busy processes (scripts/under-load.sh)
#   scripts/repeat-tests.sh --load -- -m timing   # arguments after -- go to pytest
# Prints each run's pytest summary and the failing tests, then "green runs: K of N"; exits 0 only
# when every run was green. Logs stay in the printed folder.
set -uo pipefail
runs=5
load=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --load) load=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--runs N] [--load] [-- PYTEST_ARGS...]" >&2; exit 2 ;;
  esac
done
case "$runs" in ''|*[!0-9]*|0) echo "$0: --runs must be a whole number >= 1; got '$runs'" >&2; exit 2 ;; esac
src=$(cd "$(dirname "$0")/.." && git rev-parse --show-toplevel) || exit 2
work=$(mktemp -d "${TMPDIR:-/tmp}/harness-repeat.XXXXXX")
git clone --quiet "$src" "$work/repo" || exit 2
cd "$work/repo" || exit 2
echo "fresh clone of $(git rev-parse --short HEAD) in $work/repo"
SECONDS=0
./scripts/dev-env.sh > "$work/setup.log" 2>&1 || { echo "set-up failed: see $work/setup.log"; exit 1; }
echo "set-up: ${SECONDS}s"
wrap=()
[ $load -eq 1 ] && wrap=(./scripts/under-load.sh --hogs 2 --)
green=0
for i in $(seq 1 "$runs"); do
  SECONDS=0
  "${wrap[@]}" .venv/bin/pytest -n 2 -p no:cacheprovider "$@" > "$work/run-$i.log" 2>&1
  code=$?
  summary=$(grep -E "^=+ .*(passed|failed|error|no tests ran).* =+$" "$work/run-$i.log" | tail -n 1)
  echo "run $i: exit $code in ${SECONDS}s: ${summary:-$(tail -n 1 "$work/run-$i.log")}"
  grep -E "^(FAILED|ERROR) " "$work/run-$i.log" | head -n 20
  [ $code -eq 0 ] && green=$((green + 1))
done
echo "green runs: $green of $runs$([ $load -eq 1 ] && echo ' (two busy processes beside each)') (logs in $work)"
[ "$green" -eq "$runs" ]
