#!/bin/bash
# The runs of this folder and of ../alexnet_h100_2026-12-06_three-seeds/, one after another on one fresh
# host, from a copy of the checkout in /tmp/src with DVC's wheels in .whl/ and the CIFAR-10 archive in .data/.
# Step B did not finish in the time the host was lent (see README.md).
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
# A: a fresh host and repository: the 12 variants at 1 epoch, then make fast's experiment for seed 1
#    (compile cache empty) and seed 2 (warm)
step A /tmp/w1 $out/A 420 --fast "1 2" train.epochs=1
# S: the same repository, seeds [0, 1, 2]: seed 0's stages are up to date, seeds 1 and 2 run
step S /tmp/w1 $out/S 560 'compare.seeds=[0,1,2]' train.epochs=1
# C: make fast in a new repository of a host that ran it before (data ingested by the download stage first)
FT_TARGETS=download step C /tmp/w3 $out/C 240 --fast "4" train.epochs=1
# B: the 12 variants at 1 epoch in a new repository of a host that ran them before
step B /tmp/w2 $out/B 300 train.epochs=1
