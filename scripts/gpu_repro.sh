#!/usr/bin/env bash
# The real pipeline through DVC on the GPU machine, with ARCHIVE as data.source.
#
#   scripts/gpu_repro.sh ARCHIVE OUT SECONDS [--queue J] [--fast "SEEDS"] [k=v ...]
#
#   plain       `dvc repro`, with the params overrides k=v laid over params.yaml
#   --queue J   the README's several-GPU recipe instead: every variant queued as an experiment with
#               train.nproc=1, `dvc queue start -j J` (each leases its own GPU), then `dvc repro`
#               restores them from the run-cache and compares
#   --fast S    afterwards, `make fast`'s experiment once per seed in S (FT_FAST_EXTRA: more -S flags,
#               for a CPU check)
#
# That machine has torch but no DVC and no console scripts: DVC comes from wheels carried in .whl/
# (installed once into /tmp/site), and `fasttrain`/`dvc` from two small shims. The pipeline runs in
# a git repository made from a copy of this checkout in $FT_WORK (default /tmp/ft-repro), kept
# between calls: a second call on a still-warm machine carries on where a timed-out one stopped,
# since finished stages are in dvc.lock and an unfinished train stage resumes from its checkpoint.
# OUT gets the log and results.tar.gz (metrics/, plots/, dvc.lock, params.yaml). FT_TARGETS (environment):
# the stages `dvc repro` makes (default: all), e.g. "evaluate@ddp-amp evaluate@dp-amp" with train.nproc=2.
# For a run longer than one device call, start it with scripts/detached.sh and OUT=DIR/out, then
# collect it with further calls made at once (the machine stays warm only ~30 s between calls):
#   scripts/detached.sh /tmp/ftd 570 -- scripts/gpu_repro.sh ARCHIVE /tmp/ftd/out 1500 --fast "0 1 2"
#   scripts/detached.sh /tmp/ftd 570
set -u -o pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
case $1 in *://*|cifar10|synthetic) archive=$1 ;; *) archive=$(realpath -m "$1") ;; esac  # stages run in $work
out=$(realpath -m "$2") seconds=$3; shift 3
jobs= seeds=  # --queue J and --fast "SEEDS", in either order, before the k=v overrides
while :; do
  case ${1:-} in
    --queue) jobs=$2; shift 2 ;;
    --fast) seeds=$2; shift 2 ;;
    *) break ;;
  esac
done
[ -z "$jobs" ] || set -- train.nproc=1 "$@"
work=${FT_WORK:-/tmp/ft-repro}
mkdir -p "$out"

if ! python3 -c "import dvc" 2>/dev/null; then
  [ -d /tmp/site/dvc ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site "$repo"/.whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$work/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=$(command -v python3)
mkdir -p /tmp/ft-bin
printf '#!/bin/sh\nexec %s -m fasttrain "$@"\n' "$py" > /tmp/ft-bin/fasttrain
printf '#!/bin/sh\nexec %s -m dvc "$@"\n' "$py" > /tmp/ft-bin/dvc
chmod +x /tmp/ft-bin/fasttrain /tmp/ft-bin/dvc
export PATH=/tmp/ft-bin:$PATH

if [ ! -d "$work/.git" ]; then  # first call: a git repository of the checkout, without carried files
  mkdir -p "$work"
  (cd "$repo" && tar cf - --exclude=./.git --exclude=./.whl --exclude=./.cache --exclude=./.run \
     --exclude=./.venv --exclude=./.demo .) | (cd "$work" && tar xf -)
  cd "$work"
  git init -q && git add -A && git -c user.name=fasttrain -c user.email=fasttrain@localhost commit -qm checkout
fi
cd "$work"
python3 scripts/overlay.py params.yaml /dev/null params.yaml "data.source=$archive" \
  "$@"
nvidia-smi -L 2>/dev/null | tee "$out/machine.txt"
python3 -c 'import torch; print("torch", torch.__version__)' | tee -a "$out/machine.txt"

if [ -n "$jobs" ]; then  # queue every variant's evaluate stage (and what it needs) as an experiment
  end=$((SECONDS + seconds))
  dvc repro download > "$out/repro.raw" 2>&1 || { cat "$out/repro.raw"; exit 1; }
  git add -A && git -c user.name=fasttrain -c user.email=fasttrain@localhost commit -qm "data and params" || true
  variants=$(python3 -c 'from fasttrain.layout import VARIANTS; print(*VARIANTS)')
  for v in $variants; do
    dvc exp run --queue -n "$v" "evaluate@$v" >> "$out/repro.raw" 2>&1
  done
  dvc queue start -j "$jobs" >> "$out/repro.raw" 2>&1
  pending() { [[ $(dvc queue status 2>/dev/null) =~ Queued|Running ]]; }  # (no grep -q: pipefail)
  while pending && [ $SECONDS -lt $end ]; do sleep 5; done
  pending && dvc queue stop --kill >> "$out/repro.raw" 2>&1  # out of time: stop the workers' runs too
  dvc queue status | tee -a "$out/repro.log"
  for v in $variants; do
    dvc queue logs "$v" 2>/dev/null | grep -E "epoch .*/|test accuracy|Traceback|rror" | tail -3 >> "$out/repro.log"
  done
  seconds=$(( end > SECONDS + 60 ? end - SECONDS : 60 ))  # what is left for the dvc repro below
fi

# dvc repro in a process group of its own: at the time limit the whole group gets SIGINT, as from
# Ctrl-C, so the running stage stops cleanly and its last checkpoint is what the next call resumes.
setsid dvc repro ${FT_TARGETS:-} > "$out/repro.raw" 2>&1 &
pid=$!
(sleep "$seconds"; kill -INT -- -$pid 2>/dev/null; sleep 60; kill -KILL -- -$pid 2>/dev/null) &
watchdog=$!
wait $pid
status=$?
kill $watchdog 2>/dev/null
# torchrun starts ddp workers in sessions of their own: make sure none outlives a stopped run
[ $status -eq 0 ] || pkill -KILL -f "fasttrain (train|evaluate)" 2>/dev/null
grep -v -i -e warning -e "warn(" "$out/repro.raw" | tee -a "$out/repro.log"
rm -f "$out/repro.raw"
echo "dvc repro exit status $status"
if [ -n "$seeds" ] && [ $status -eq 0 ]; then
  git add -A && git -c user.name=fasttrain -c user.email=fasttrain@localhost commit -qm "classic recipe" || true
  for seed in $seeds; do  # exactly what `make fast` runs, one experiment per seed
    dvc exp run --temp $(python3 scripts/overlay.py --dvc-flags recipes/fast.yaml) -S "train.seed=$seed" \
      ${FT_FAST_EXTRA:-} train@single-bf16 evaluate@single-bf16 2>&1 | grep -v -i -e warning -e "warn(" | tail -4 | tee -a "$out/fast.log"
  done
  dvc exp show --json > "$out/fast-experiments.json"
fi
tar czf "$out/results.tar.gz" metrics plots dvc.lock params.yaml 2>/dev/null
exit $status
