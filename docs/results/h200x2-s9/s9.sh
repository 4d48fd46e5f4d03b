#!/usr/bin/env bash
# session 9, one detached job on nvidia-h200-x2: the README's results run (issue 3, target 5).
#  1. scripts/gpu_repro.sh --queue 2 --fast "0 1 2": the 12 classic variants, 20 epochs, through DVC (one GPU
#     each, dp/ddp on one GPU), then `dvc repro` (run-cache restores + compare), then `make fast`'s
#     experiment for seeds 0 1 2 (the recipe as committed: adam_beta2 0.99), one at a time.
#  2. With what is left before a deadline (job time DEADLINE s): more seeds of the same recipe, alone on each
#     GPU (one run at a time per GPU), for the recipe's failure rate and its seconds.
repo=$PWD; export PYTHONUNBUFFERED=1; o=/tmp/ftd/out; mkdir -p $o; A=$repo/.cache/cifar10-jpeg.tar.gz
{ date -u; nvidia-smi -L; nproc; uptime; } > $o/host.txt 2>&1
bash scripts/gpu_repro.sh $A $o/repro 1150 --queue 2 --fast "0 1 2"
rc=$?
echo "gpu_repro exit $rc after $SECONDS s $(date -u +%T)" | tee -a $o/host.txt
left=$(( ${DEADLINE:-1430} - SECONDS ))
if [ $left -gt 100 ]; then
  for g in 0 1; do
    ( export CUDA_VISIBLE_DEVICES=$g FT_BASE=/tmp/ftb$g NO_TESTS=1
      seeds=$([ $g = 0 ] && echo "26 27 28" || echo "29 30 31")
      timeout $left bash scripts/gpu_fast.sh $A /tmp/s9/gpu$g "$seeds" "train.adam_beta2=0.99" skip-bench \
        > /tmp/s9-gpu$g.log 2>&1 ) &
  done
  wait
  mkdir -p /tmp/s9 && cp /tmp/s9-gpu*.log /tmp/s9/ && tar czf $o/more.tar.gz -C /tmp s9
  python3 scripts/fast_summary.py /tmp/s9/gpu0 /tmp/s9/gpu1 --runs
fi
date -u >> $o/host.txt
exit $rc
