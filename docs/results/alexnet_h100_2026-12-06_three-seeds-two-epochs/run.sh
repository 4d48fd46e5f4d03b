#!/bin/bash
# The runs of this folder and of ../alexnet_h100_2026-12-06_early-exit/ (its warm host: steps B and P),
# one after another on one fresh host, from a copy of the checkout in /tmp/src with DVC's wheels in .whl/
# and the CIFAR-10 archive in .data/ (exit_probe.py and exitprobe/: ../alexnet_h100_2026-12-06_early-exit/).
set -u
src=/tmp/src out=/tmp/d/out archive=/tmp/src/.data/cifar10-jpeg.tar.gz
cd $src
SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $out/pip.log 2>&1
echo "pip rc $? in $SECONDS s" | tee -a $out/steps.log
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 FT_TIME=1
export TORCHINDUCTOR_CACHE_DIR=$HOME/.cache/fasttrain/torchinductor  # as the Makefile sets it
nvidia-smi -L | tee $out/machine.txt; env | grep -E '^PYTHON|^CUDA' >> $out/machine.txt
step() {  # name, then repro.sh's arguments
  local name=$1; shift
  local t=$SECONDS
  bash scripts/gpu/repro.sh $archive "$@"
  echo "$name rc $? in $((SECONDS - t)) s (at $SECONDS s)" | tee -a $out/steps.log
}
# S: the 12 variants, seeds 0-2, 2 epochs (this folder)
step S /tmp/w1 $out/S 1000 'compare.seeds=[0,1,2]' train.epochs=2
# B: the 12 variants at 1 epoch in a new repository of a host that ran them before, then make fast seeds 1 and 2
step B /tmp/w2 $out/B 400 --fast "1 2" train.epochs=1
# P: where a CUDA process's exit goes
(cd /tmp/src && PATH=/tmp/w2/.dvc/tmp/bin:$PATH PYTHONPATH=/tmp/w2/src:/tmp/site timeout 120 python3 .data/exit_probe.py /tmp/w2 3) > $out/exit_probe.txt 2>&1
echo "P rc $? (at $SECONDS s)" | tee -a $out/steps.log
