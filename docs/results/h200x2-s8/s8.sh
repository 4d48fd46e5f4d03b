#!/usr/bin/env bash
# session 8 (nvidia-h200-x2): which change makes the fast recipe's switch from 160 to 227 px safe?
# An accuracy sweep: JOBS=4 runs share each GPU (their seconds are not the recipe's), seeds 0-15, seed by seed.
#  GPU 0: A = train.adam_beta2=0.99            C = adam_beta2=0.99 + progressive_warmup=1
#  GPU 1: B = train.progressive_warmup=1       D = no switch: progressive_epochs=0, epochs=20
repo=$PWD; export PYTHONUNBUFFERED=1; o=/tmp/ftd/out; mkdir -p $o; A=$repo/.cache/cifar10-jpeg.tar.gz
{ date -u; nvidia-smi -L; nproc; uptime; git -C $repo log -1 --format=%H 2>/dev/null; } > $o/host.txt 2>&1
mkdir -p /tmp/s8; seeds=$(seq -s ' ' 0 15)
( export CUDA_VISIBLE_DEVICES=0 JOBS=4 FT_BASE=/tmp/ftb0 NO_TESTS=1
  timeout ${T:-900} bash scripts/gpu_fast.sh $A /tmp/s8/gpu0 "$seeds" \
    "train.adam_beta2=0.99 train.adam_beta2=0.99,train.progressive_warmup=1" skip-bench > /tmp/s8/gpu0.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1 JOBS=4 FT_BASE=/tmp/ftb1 NO_TESTS=1; sleep 3
  timeout ${T:-900} bash scripts/gpu_fast.sh $A /tmp/s8/gpu1 "$seeds" \
    "train.progressive_warmup=1 train.progressive_epochs=0,train.epochs=20" skip-bench > /tmp/s8/gpu1.log 2>&1 ) &
wait
date -u >> $o/host.txt
tar czf $o/s8.tar.gz -C /tmp s8
for g in 0 1; do python3 - /tmp/s8/gpu$g/fast.jsonl <<'PY'
import json, sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line); rows[r["overrides"]].append((r["seed"], r["test_accuracy"]))
for k, v in rows.items():
    acc = [a for _, a in sorted(v)]
    print(f"{k}: n={len(acc)} min={min(acc):.4f} mean={sum(acc)/len(acc):.4f} below0.84={sum(a < 0.84 for a in acc)}",
          " ".join(f"{s}:{a:.4f}" for s, a in sorted(v)))
PY
done
