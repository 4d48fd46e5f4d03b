#!/usr/bin/env bash
# session 7, call 2 (nvidia-h200-x2): is seed 2's 0.8284 (fast recipe with pad_channels, dvc run) the switch or chance?
#  GPU 0: the kernel's GPU unit tests, then the fast recipe with pad_channels (as recipes/fast.yaml now) seeds 2 3 4
#  GPU 1: the same recipe with train.pad_channels=false, seeds 2 3 4 -- each run's per-epoch curve kept
repo=$PWD; export PYTHONUNBUFFERED=1; o=/tmp/ftd/out; mkdir -p $o; A=$repo/.cache/cifar10-jpeg.tar.gz
{ date -u; nvidia-smi -L; nproc; uptime; } > $o/host.txt 2>&1
( export CUDA_VISIBLE_DEVICES=0; cd $repo && PYTHONPATH=src timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/unit/test_batch_kernel.py tests/unit/test_models.py 2>&1 | tail -5 > $o/pytest-gpu.txt
  FT_BASE=/tmp/ftb0 NO_TESTS=1 timeout ${T:-420} bash scripts/gpu_fast.sh $A $o/pad "2 3 4" "train.pad_channels=true" skip-bench > $o/pad.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; sleep 5
  FT_BASE=/tmp/ftb1 NO_TESTS=1 timeout ${T:-420} bash scripts/gpu_fast.sh $A $o/nopad "2 3 4" "train.pad_channels=false" skip-bench > $o/nopad.log 2>&1 ) &
wait
cat $o/pytest-gpu.txt; cat $o/pad/fast.jsonl $o/nopad/fast.jsonl 2>/dev/null | cut -c1-300
