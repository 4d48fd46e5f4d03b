#!/usr/bin/env bash
# session 8, call 3: the fast recipe with adam_beta2 0.99, through DVC (make fast's experiment), seeds 0 1 2, one run at a time
o=/tmp/ftd2/out; mkdir -p $o; { date -u; nvidia-smi -L; nproc; } > $o/host.txt 2>&1
FT_TARGETS=download bash scripts/gpu_repro.sh .cache/cifar10-jpeg.tar.gz $o 300 --fast "0 1 2"
echo "gpu_repro exit $?"; date -u >> $o/host.txt
