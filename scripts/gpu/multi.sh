#!/usr/bin/env bash
# On a host with 2+ GPUs: dp and ddp against one GPU, short runs of the commands the stages run.
#
#   scripts/gpu/multi.sh ARCHIVE WORK OUT EPOCHS "RUN ..."   RUN = parallel:precision:batch[:nproc[:loader]]
#
# batch is global, as train.batch_size; nproc only for ddp. WORK is the scratch folder (WORK/base: the
# prepared data set, reused; WORK/RUN: one run). One JSON line per run goes to OUT/multi.jsonl: the
# steady-state images/s (first epoch excluded), seconds per epoch, peak memory and accuracy; its log
# to OUT/train-RUN.log. A run stopped at its limit dumps every thread's Python stack into its log.
# Environment: FT_EXTRA: more k=v overrides for every run (a CPU check); RUN_SECONDS: the time limit
# of one run (240).
set -u
[ $# -eq 5 ] || { echo "usage: $0 ARCHIVE WORK OUT EPOCHS \"RUN ...\"" >&2; exit 2; }
case $1 in cifar10|synthetic|*://*) archive=$1 ;; *) archive=$(realpath "$1") ;; esac
work=$(realpath -m "$2"); out=$(realpath -m "$3"); epochs=$4; runs=$5
repo=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$repo/src PYTHONUNBUFFERED=1
mkdir -p "$out"
base=$work/base && mkdir -p "$base" && cd "$base"
python3 "$repo/scripts/overlay.py" "$repo/params.yaml" /dev/null params.yaml "data.source=$archive" ${FT_EXTRA:-}
[ -f data/dataset.pt ] || python3 -m fasttrain download
for run in $runs; do
  IFS=: read -r par prec batch nproc loader <<< "$run"
  d=$work/$par-$prec-$batch-${nproc:-x}-${loader:-gpu} && rm -rf "$d" && mkdir -p "$d/data" && cd "$d"
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
found = glob.glob("metrics/train/*/*.json")
if not found:
    sys.exit(print("MULTI none: the run wrote no metrics"))
t = {**json.load(open(found[0].replace("metrics/", "diagnostics/", 1))), **json.load(open(found[0]))}
keep = ("variant", "batch_size", "world_size", "device_count", "epochs", "epoch_seconds", "images_per_second",
        "peak_memory_mb", "test_accuracy", "device", "torch_version", "warnings")
row = {"run": sys.argv[2], "loader": sys.argv[3], **{k: t.get(k) for k in keep}}
open(sys.argv[1], "a").write(json.dumps(row) + "\n"); print("MULTI", json.dumps(row))
PY
done
