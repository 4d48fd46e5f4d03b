#!/usr/bin/env bash
# The real pipeline through DVC on a GPU host, with ARCHIVE as data.source, in a repository of its own.
#
#   scripts/gpu/repro.sh ARCHIVE WORK OUT SECONDS [--queue J] [--fast "SEEDS"] [k=v ...]
#
#   plain       `dvc repro`, with the params overrides k=v laid over params.yaml
#   --queue J   the several-GPU recipe (README, "Several variants on several GPUs") instead: every variant
#               (FT_VARIANTS: some) queued as an experiment with train.nproc=1, `dvc queue start -j J`
#               (each leases its own GPU), then `dvc repro` restores them from the run-cache and
#               compares. If the queue runs out of SECONDS it is stopped and the call exits 75; call
#               again with the same arguments (the queue is not run twice): its `dvc repro` restores
#               what finished and runs the rest
#   --fast S    afterwards, `make fast`'s experiment once per seed in S (FT_FAST_EXTRA: more -S flags,
#               for a CPU check)
#
# WORK is a git repository made from a copy of this checkout on the first call and kept between
# calls: a call that ran out of time carries on in the next, since finished stages are in dvc.lock
# and an unfinished train stage resumes from its checkpoint. DVC must be importable by python3
# (`pip install dvc`); `fasttrain` and `dvc` are run as `python3 -m ...` through two small shims, so
# no console scripts are needed. OUT gets repro.log (with --queue also queue.log) and
# results.tar.gz (metrics/, plots/, dvc.lock, params.yaml). FT_TARGETS (environment): the stages
# `dvc repro` makes (default: all), e.g. "evaluate@ddp-amp-0 evaluate@dp-amp-0" with train.nproc=2.
# A run longer than one command may last can go through scripts/gpu/detached.sh with OUT=DIR/out.
# FT_TIME=1 (environment): `dvc repro` and each `make fast` experiment run under
# scripts/time_to_answer.py, whose tables (wall, work and fixed cost per stage) go to OUT/time_to_answer.md.
# Both run under `fasttrain serve`, as make runs them; FT_SERVE=0: without it.
set -u -o pipefail
[ $# -ge 4 ] || { echo "usage: $0 ARCHIVE WORK OUT SECONDS [--queue J] [--fast \"SEEDS\"] [k=v ...]" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/../.." && pwd)
case $1 in *://*|cifar10|synthetic) archive=$1 ;; *) archive=$(realpath -m "$1") ;; esac  # stages run in $work
work=$(realpath -m "$2") out=$(realpath -m "$3") seconds=$4; shift 4
jobs= seeds=  # --queue J and --fast "SEEDS", in either order, before the k=v overrides
while :; do
  case ${1:-} in
    --queue) jobs=$2; shift 2 ;;
    --fast) seeds=$2; shift 2 ;;
    *) break ;;
  esac
done
[ -z "$jobs" ] || set -- train.nproc=1 "$@"
mkdir -p "$out"
python3 -c "import dvc" 2>/dev/null || { echo "repro.sh: python3 cannot import dvc: pip install dvc" >&2; exit 1; }
export PYTHONPATH=$work/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

if [ ! -d "$work/.git" ]; then  # first call: a git repository of the checkout's sources
  mkdir -p "$work"
  (cd "$repo" && tar cf - --exclude=./.git --exclude=./.venv --exclude=./.demo --exclude=./.cache \
     --exclude=./.dvc/cache --exclude=./.dvc/tmp --exclude=./.whl --exclude=./.data --exclude=./data --exclude=./models --exclude=./checkpoints \
     --exclude=./tensorboard --exclude=./metrics --exclude=./plots .) | (cd "$work" && tar xf -)
  cd "$work"
  git init -q && git add -A && git -c user.name=fasttrain -c user.email=fasttrain@localhost commit -qm checkout
fi
cd "$work"
py=$(command -v python3) bin=$work/.dvc/tmp/bin  # (.dvc/tmp: ignored by git and DVC)
mkdir -p "$bin"
printf '#!/bin/sh\nexec %s -m fasttrain "$@"\n' "$py" > "$bin/fasttrain"
printf '#!/bin/sh\nexec %s -m dvc "$@"\n' "$py" > "$bin/dvc"
chmod +x "$bin/fasttrain" "$bin/dvc"
export PATH=$bin:$PATH
python3 scripts/overlay.py params.yaml /dev/null params.yaml "data.source=$archive" \
  "$@"
nvidia-smi -L 2>/dev/null | tee "$out/machine.txt"
python3 -c 'import torch; print("torch", torch.__version__)' | tee -a "$out/machine.txt"

queued=.dvc/tmp/repro-queued  # the queue ran (a later call with --queue goes straight to dvc repro)
if [ -n "$jobs" ] && [ ! -e "$queued" ]; then  # queue every variant's evaluate stage as an experiment
  end=$((SECONDS + seconds))
  dvc repro download > "$out/queue.raw" 2>&1 || { cat "$out/queue.raw"; exit 1; }
  git add -A && git -c user.name=fasttrain -c user.email=fasttrain@localhost commit -qm "data and params" || true
  variants=${FT_VARIANTS:-$(python3 -c 'from fasttrain.layout import VARIANTS; print(*VARIANTS)')}
  for v in $variants; do
    dvc exp run --queue -n "$v" "evaluate@$v-0" >> "$out/queue.raw" 2>&1 || { cat "$out/queue.raw"; exit 1; }
  done
  dvc queue start -j "$jobs" >> "$out/queue.raw" 2>&1
  touch "$queued"
  pending() { [[ $(dvc queue status 2>/dev/null) =~ Queued|Running ]]; }  # (no grep -q: pipefail)
  while pending && [ $SECONDS -lt $end ]; do sleep 5; done
  late=; pending && late=1 && dvc queue stop --kill >> "$out/queue.raw" 2>&1  # stop the workers' runs too
  grep -v -i -e warning -e "warn(" "$out/queue.raw" > "$out/queue.log"; rm -f "$out/queue.raw"
  queue=$(dvc queue status 2>/dev/null)
  tee -a "$out/repro.log" <<< "$queue"
  for v in $variants; do
    dvc queue logs "$v" 2>/dev/null | grep -E "epoch .*/|test accuracy|Traceback|rror" | tail -3 >> "$out/repro.log"
  done
  if [ -n "$late" ]; then  # what finished is in DVC's run-cache: the next call's dvc repro restores it
    ok=$(grep -c Success <<< "$queue")
    echo "repro.sh: the queue ran out of time ($ok of $(wc -w <<< "$variants") experiments succeeded);" \
      "call again with the same arguments: its dvc repro restores what finished and runs the rest"
    exit 75
  fi
  seconds=$(( end > SECONDS + 60 ? end - SECONDS : 60 ))  # what is left for the dvc repro below
fi

# dvc repro in a process group of its own: at the time limit the whole group gets SIGINT, as from
# Ctrl-C, so the running stage stops cleanly and its last checkpoint is what the next call resumes.
timer=() serve=(fasttrain serve --)  # as make repro runs it; FT_SERVE=0: every process on its own
[ -z "${FT_TIME:-}" ] || timer=(python3 scripts/time_to_answer.py --out "$out/time_to_answer.md" --)
[ "${FT_SERVE:-1}" != 0 ] || serve=()
setsid "${timer[@]}" "${serve[@]}" dvc repro ${FT_TARGETS:-} > "$out/repro.raw" 2>&1 &
pid=$!
# The watchdog is a process group of its own too, so that its sleep ends with it (a sleep left
# behind would hold this script's stdout open for its caller).
setsid bash -c 'sleep "$0"; kill -INT -- -"$1"; sleep 60; kill -KILL -- -"$1"' "$seconds" $pid > /dev/null 2>&1 &
watchdog=$!
wait $pid
status=$?
kill -- -$watchdog 2>/dev/null
# A stopped run: end what is left of its own process group (ddp's workers end with their launcher).
[ $status -eq 0 ] || kill -KILL -- -$pid 2>/dev/null
grep -v -i -e warning -e "warn(" "$out/repro.raw" | tee -a "$out/repro.log"
rm -f "$out/repro.raw"
echo "dvc repro exit status $status"
if [ -n "$seeds" ] && [ $status -eq 0 ]; then
  git add -A && git -c user.name=fasttrain -c user.email=fasttrain@localhost commit -qm "classic recipe" || true
  for seed in $seeds; do  # exactly what `make fast` runs, one experiment per seed
    "${timer[@]}" "${serve[@]}" dvc exp run --temp $(python3 scripts/overlay.py --dvc-flags recipes/fast.yaml) -S "compare.seeds=[$seed]" \
      ${FT_FAST_EXTRA:-} train@single-bf16-$seed evaluate@single-bf16-$seed 2>&1 | grep -v -i -e warning -e "warn(" | tail -${FT_TIME:+14}4 | tee -a "$out/fast.log"
  done
  dvc exp show --json > "$out/fast-experiments.json"
fi
tar czf "$out/results.tar.gz" metrics plots dvc.lock params.yaml 2>/dev/null
exit $status
