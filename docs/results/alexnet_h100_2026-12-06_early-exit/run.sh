#!/bin/bash
# The runs of fresh-host.md and evaluate-ab.txt, on one fresh host, from a copy of the checkout (5cb3c6e)
# with DVC's wheels in .whl/ and the CIFAR-10 archive in .data/; OUT the folder for the results.
set -u
src=$PWD out=$OUT archive=$PWD/.data/cifar10-jpeg.tar.gz
SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/pip.log 2>&1
echo "pip rc $? in $SECONDS s" | tee -a $out/steps.log
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 FT_TIME=1
export TORCHINDUCTOR_CACHE_DIR=$HOME/.cache/fasttrain/torchinductor  # as the Makefile sets it
nvidia-smi -L > $out/machine.txt
PYTHONPATH=$src/src:/tmp/site python3 -c "import torch; torch.zeros(1, device='cuda'); from fasttrain import lease; print('gpus shared', lease._gpus_shared())" >> $out/machine.txt 2>&1
t=$SECONDS; bash scripts/gpu/repro.sh $archive /tmp/w1 $out/A 240 train.epochs=1 > /tmp/A.txt 2>&1
echo "A rc $? in $((SECONDS - t)) s (at $SECONDS s)" | tee -a $out/steps.log
cp -r /tmp/w1/src /tmp/old_src
sed -i 's/    if not _served or _status is None or _report_fd is None:/    if True:/' /tmp/old_src/fasttrain/server.py
grep -c "if True:" /tmp/old_src/fasttrain/server.py >> $out/steps.log
cd /tmp/w1
for which in new old new; do
  s=/tmp/w1/src; [ $which = old ] && s=/tmp/old_src
  PYTHONPATH=$s:/tmp/site timeout 50 python3 -m fasttrain serve -- bash -c 'sleep 5; for i in 1 2 3 4; do a=$(date +%s.%N); python3 -m fasttrain evaluate --parallel single --precision bf16 > /dev/null 2>&1; r=$?; echo -n "$r $(awk "BEGIN{print $(date +%s.%N) - $a}") "; done; echo' 2>&1 | sed "s/^/$which /" >> $out/evaluate_ab.txt
done
echo "E done at $SECONDS s" >> $out/steps.log
