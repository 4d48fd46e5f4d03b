#!/usr/bin/env bash
# Run a command that outlasts the call that starts it, and collect it in later calls.
#
#   scripts/gpu/detached.sh DIR SECONDS -- CMD [ARG ...]   start CMD (unless DIR already holds a run), wait
#   scripts/gpu/detached.sh DIR SECONDS                    wait for the run DIR holds
#
# For hosts where one command may last only so long (a remote-execution call, a batch job's step):
# CMD runs in a process session of its own (setsid), so it lives on after the call returns, as long
# as the host does. Its stdout and stderr go to DIR/log, its exit status to DIR/rc. Each call waits
# up to SECONDS for it, prints the log's last DETACHED_TAIL lines (40) and, once it has ended, copies
# DIR/out/ (where CMD should write its results) to $OUT when OUT is set. Exit status: CMD's once it
# has ended, 75 while it still runs, 1 if DIR's run is gone without an exit status (killed, or the
# host went away), 2 if DIR holds no run. To stop it, end its process group, and only that:
# kill -- -$(cat DIR/pid)
set -u -o pipefail
[ $# -ge 2 ] || { echo "usage: $0 DIR SECONDS [-- CMD [ARG ...]]" >&2; exit 2; }
dir=$1 seconds=$2; shift 2
mkdir -p "$dir/out"
if [ "${1:-}" = -- ]; then
  shift
  if [ -e "$dir/pid" ]; then
    echo "detached: $dir already holds a run (pid $(cat "$dir/pid")): waiting for it, not starting another"
  else
    setsid bash -c '"$@" > "$0/log" 2>&1; echo $? > "$0/rc.tmp"; mv "$0/rc.tmp" "$0/rc"' "$dir" "$@" \
      < /dev/null > /dev/null 2>&1 &
    echo $! > "$dir/pid"
    echo "detached: started pid $! at $(date -u +%T): $*"
  fi
fi
[ -e "$dir/pid" ] || { echo "detached: no run in $dir; start one with: $0 $dir SECONDS -- CMD" >&2; exit 2; }

end=$((SECONDS + seconds))
while [ ! -e "$dir/rc" ] && [ $SECONDS -lt $end ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; do
  sleep 2
done
tail -n "${DETACHED_TAIL:-40}" "$dir/log" 2>/dev/null
if [ -e "$dir/rc" ]; then
  rc=$(cat "$dir/rc")
  [ -n "${OUT:-}" ] && cp -r "$dir/out/." "$OUT/"
  echo "detached: ended with exit status $rc at $(date -u +%T)"
  exit "$rc"
fi
if kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
  echo "detached: still running at $(date -u +%T); call again: $0 $dir SECONDS"
  exit 75
fi
echo "detached: the run in $dir is gone without an exit status" >&2
exit 1
