#!/usr/bin/env bash
# Runs a command while busy processes load every CPU core: what a shared CI runner or a developer's
# busy laptop does to timing tests. Exits with the command's status; the busy processes always stop.
#   scripts/under-load.sh -- .venv/bin/pytest -n 2 -m timing
#   scripts/under-load.sh --hogs 4 -- harness compare
set -euo pipefail
hogs=2
while [ $# -gt 0 ]; do
  case "$1" in
    --hogs) hogs=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--hogs N] -- COMMAND [ARGS...]" >&2; exit 2 ;;
  esac
done
if [ $# -eq 0 ]; then echo "usage: $0 [--hogs N] -- COMMAND [ARGS...]" >&2; exit 2; fi
case "$hogs" in ''|*[!0-9]*) echo "$0: --hogs must be a whole number; got '$hogs'" >&2; exit 2 ;; esac
pids=()
# shellcheck disable=SC2329  # called by the trap
stop() { [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true; }
trap stop EXIT INT TERM
for _ in $(seq 1 "$hogs"); do
  python3 -c 'while True: pass' &
  pids+=($!)
done
echo "under-load: $hogs busy process(es) running (${pids[*]}): $*" >&2
status=0
"$@" || status=$?
echo "under-load: '$*' exited $status" >&2
exit $status
