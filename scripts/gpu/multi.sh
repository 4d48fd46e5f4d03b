#!/usr/bin/env bash
# On a machine with 2+ GPUs: dp and ddp against one GPU, short runs of the click commands the stages run.
# Usage: scripts/gpu_multi.sh ARCHIVE OUT EPOCHS "RUN ..."   RUN = parallel:precision:batch[:nproc[:loader]]
# (batch is global, as train.batch_size; nproc only for ddp). One JSON line per run -> OUT/multi.jsonl.
# FT_EXTRA: more k=v overrides for every run (a CPU check); RUN_SECONDS: time limit of one run (240). The rows carry the steady-state images/s (first epoch excluded), seconds per epoch, peak memory and accuracy.
set -u
case $1 in cifar10|synthetic|*://*) archive=$1 ;; *) archive=$(realpath "$1") ;; esac
out=$(realpath -m "$2"); epochs=$3; runs=$4
repo=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=$repo/src PYTHONUNBUFFERED=1
mkdir -p "$out"
base=/tmp/ft-multi && mkdir -p $base && cd $base
python3 "$repo/scripts/overlay.py" "$repo/params.yaml" /dev/null params.yaml "data.source=$archive" ${FT_EXTRA:-}
[ -f data/dataset.pt ] || python3 -m fasttrain download
for run in $runs; do
  IFS=: read -r par prec batch nproc loader <<< "$run"
  d=/tmp/ft-multi-$par-$prec-$batch-${nproc:-x}-${loader:-gpu} && rm -rf $d && mkdir -p $d/data && cd $d
  ln -s $base/data/dataset.pt data/dataset.pt
  python3 "$repo/scripts/overlay.py" $base/params.yaml /dev/null params.yaml "train.epochs=$epochs" \
    "train.batch_size=$batch" "data.loader=${loader:-gpu}" $([ -n "${nproc:-}" ] && echo "train.nproc=$nproc")
  echo "== $run"
  # at most RUN_SECONDS a run; a run stopped then dumps every thread's Python stack (faulthandler on
  # SIGABRT) into its log, to see where it stood
  PYTHONFAULTHANDLER=1 timeout -s ABRT -k 15 "${RUN_SECONDS:-240}" \
    python3 -m fasttrain train --parallel $par --precision $prec > train.log 2>&1
  echo "exit status $?"; grep -v -i warn train.log | tail -3; cp train.log "$out/train-${run//:/_}.log"
  python3 - "$out/multi.jsonl" "$run" "${loader:-gpu}" <<'PY'
import glob, json, sys
found = glob.glob("metrics/train/*.json")
if not found:
    sys.exit(print("MULTI none: the run wrote no metrics"))
t = json.load(open(found[0]))
keep = ("variant", "batch_size", "world_size", "device_count", "epochs", "epoch_seconds", "images_per_second",
        "peak_memory_mb", "final_test_accuracy", "device", "torch_version", "warnings")
row = {"run": sys.argv[2], "loader": sys.argv[3], **{k: t.get(k) for k in keep}}
open(sys.argv[1], "a").write(json.dumps(row) + "\n"); print("MULTI", json.dumps(row))
PY
done
