#!/usr/bin/env bash
# session 7, one detached job on nvidia-h200-x4: the README's results run.
#  the 12 classic variants, 20 epochs, through DVC (gpu_repro.sh --queue 4: one GPU each, dp/ddp on one GPU),
#  then `dvc repro` (run-cache restores + compare), then `make fast`'s experiment for seeds 0 1 2 (pad_channels on)
repo=$PWD; export PYTHONUNBUFFERED=1; o=/tmp/ftd/out; mkdir -p $o
{ date -u; nvidia-smi -L; nproc; uptime; git -C $repo log --oneline -1 2>/dev/null; } > $o/host.txt 2>&1
t0=$SECONDS
bash scripts/gpu_repro.sh $repo/.cache/cifar10-jpeg.tar.gz $o 1200 --queue 4 --fast "0 1 2"
rc=$?
echo "gpu_repro exit $rc after $((SECONDS - t0)) s $(date -u +%T)" | tee -a $o/host.txt
exit $rc
