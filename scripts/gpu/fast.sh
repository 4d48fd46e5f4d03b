#!/usr/bin/env bash
# On a GPU host, without DVC: unit tests (GPU ones included), `fasttrain bench`, and the fast recipe
# over seeds and configurations, through the same `fasttrain train`/`evaluate` commands the stages run.
#
#   scripts/gpu/fast.sh ARCHIVE WORK OUT "SEEDS" ["k=v,k=v k=v ..."] [skip-bench]
#
# WORK is the scratch folder (WORK/base: the prepared data set; WORK/run-N-SEED: one run), so two can
# run at once with two WORKs, one per GPU. OUT gets machine.txt, bench.json, fast.jsonl (one row per
# run) and each run's per-epoch curve, epochs-N-SEED.csv. Each space-separated item of the 5th
# argument is one configuration of overrides on recipes/fast.yaml, numbered N from 1, e.g.
# "train.epochs=19 train.epochs=21,train.progressive_epochs=8,train.progressive_size=160".
# The runs go seed by seed, every configuration for a seed before the next seed.
# Environment: BENCH_CASES replaces the default `fasttrain bench` cases; NO_TESTS=1 skips the unit
# tests (otherwise they run first, for at most 10 minutes, their whole output in OUT/pytest.log);
# JOBS=n (default 1) trains n runs at once on the one GPU, for an accuracy sweep: their
# train_seconds are not the recipe's (they share the GPU), and each row of fast.jsonl says "jobs": n.
set -u
[ $# -ge 4 ] || { echo "usage: $0 ARCHIVE WORK OUT \"SEEDS\" [\"CONFIGS\"] [skip-bench]" >&2; exit 2; }
archive=$(realpath "$1"); work=$(realpath -m "$2"); out=$(realpath -m "$3"); seeds=$4; configs=${5:-recipe}
repo=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$repo/src PYTHONUNBUFFERED=1
ft() { python3 -m fasttrain "$@"; }
mkdir -p "$out"
{ nvidia-smi -L 2>/dev/null; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'; } | tee "$out/machine.txt"
# the unit tests, GPU ones included, at most 10 minutes; a test hung for 2 minutes prints every thread's stack
[ -n "${NO_TESTS:-}" ] || (cd "$repo" && timeout -k 10 600 python3 -m pytest tests/unit -q -p no:cacheprovider \
  -o faulthandler_timeout=120 > "$out/pytest.log" 2>&1; echo "pytest exit status $?" >> "$out/pytest.log"
  tail -5 "$out/pytest.log") | tee "$out/pytest.txt"

base=$work/base && rm -rf "$base" "$work"/run-* && mkdir -p "$base" && cd "$base"
python3 "$repo/scripts/overlay.py" "$repo/params.yaml" /dev/null params.yaml "data.source=$archive"
ft download
python3 "$repo/scripts/overlay.py" params.yaml "$repo/recipes/fast.yaml" fast.yaml
if [ "${6:-}" != skip-bench ]; then
  cases=${BENCH_CASES:-"64:amp 64:amp:compile=reduce-overhead 512:bf16:compile"}
  ft bench --params params.yaml $(printf -- '--case %s ' $cases) --out "$out/bench.json" 2>&1 \
    | grep -v -i -e warn -e autotune -e triton_mm -e "^  mm " -e "^strides" -e "^dtypes"
fi

one() {  # one run: config number $1, config $2, seed $3; its log is printed in one piece at the end
  local n=$1 config=$2 seed=$3 d=$work/run-$1-$3
  rm -rf $d && mkdir -p $d/data && cd $d && ln -s $base/data/dataset.pt data/dataset.pt
  local sets=${config//,/ } && [ "$config" = recipe ] && sets=""
  python3 "$repo/scripts/overlay.py" $base/params.yaml "$repo/recipes/fast.yaml" params.yaml $sets
  {
    echo "config $n: $config seed $seed"
    local t0 t1 t2
    t0=$(date +%s.%N)
    FASTTRAIN_LOCK_DIR=$d ft train --parallel single --precision bf16 --seed $seed 2>&1 | grep -v Warning | tail -4
    t1=$(date +%s.%N)
    FASTTRAIN_LOCK_DIR=$d ft evaluate --parallel single --precision bf16 --seed $seed
    t2=$(date +%s.%N)
    python3 - "$out/fast.jsonl" "$config" "${JOBS:-1}" $n $t0 $t1 $t2 $seed <<'PY'
import datetime, json, sys
def record(stage):  # headline metrics and diagnostics, one dict
    return {k: v for top in ("diagnostics", "metrics")
            for k, v in json.load(open(f"{top}/{stage}/seed{sys.argv[8]}/single-bf16.json")).items()}
t, e = record("train"), record("eval")
row = {k: t[k] for k in ("seed", "epochs", "train_seconds", "compile_seconds", "images_per_second", "peak_memory_mb", "device", "torch_version")}
row["test_accuracy"] = e["test_accuracy"]
row["overrides"] = sys.argv[2]
row["jobs"] = int(sys.argv[3])  # runs sharing the GPU: above 1, the seconds are not the recipe's
row["config"] = int(sys.argv[4])  # its number: the N of its curve, epochs-N-SEED.csv
t0, t1, t2 = map(float, sys.argv[5:8])  # each command's wall time, start-up and compile included
row["train_wall_seconds"], row["evaluate_wall_seconds"] = round(t1 - t0, 2), round(t2 - t1, 2)
row["started_at"] = datetime.datetime.fromtimestamp(t0, datetime.timezone.utc).isoformat(timespec="seconds")  # UTC
for k in ("eval_seconds", "capture_seconds", "capture_seconds_each", "first_epoch_seconds", "compile_seconds_each",
          "checkpoints_written", "compile_cache", "compile_workers"):
    row[k] = t.get(k)
row["train_process_seconds"], row["evaluate_process_seconds"] = t["process_seconds"], e["process_seconds"]  # by phase
open(sys.argv[1], "a").write(json.dumps(row) + "\n"); print("FAST", json.dumps(row))
PY
    cp plots/train/seed$seed/single-bf16.csv "$out/epochs-$n-$seed.csv"  # the run's curve: loss and test accuracy by epoch
  } > $d/run.log 2>&1
  cat $d/run.log
}

for seed in $seeds; do n=0; for config in $configs; do n=$((n + 1))
  while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-1}" ]; do wait -n; done
  one $n "$config" $seed &
done; done
wait
