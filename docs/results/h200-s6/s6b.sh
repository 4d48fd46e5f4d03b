#!/usr/bin/env bash
# session 6, call 2 (nvidia-h200-x4), one detached job:
#  A  fasttrain bench, batch 512 bf16 compiled, with train.pad_channels (alone on the machine)
#  B  the 12 classic variants, 20 epochs, through DVC: gpu_repro.sh --queue 4 (one GPU each)
#  C  the fast recipe (now with pad_channels) for seeds 0 1 2, one per GPU 1-3, at once
repo=$PWD; export PYTHONUNBUFFERED=1; w=/tmp/ftd/w; o=/tmp/ftd/out; mkdir -p $w $o
A=$repo/.cache/cifar10-jpeg.tar.gz; t0=$SECONDS; deadline=$((t0 + ${JOB_SECONDS:-900}))
stamp() { echo "PHASE $1 at $((SECONDS - t0)) s $(date -u +%T)" | tee -a $w/phases.txt; }
stamp A-bench
{ nvidia-smi -L; nproc; uptime; python3 -c 'import torch; print("torch", torch.__version__)'; } > $w/machine.txt 2>&1
( export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$repo/src; b=/tmp/ftb; mkdir -p $b && cd $b
  python3 $repo/scripts/overlay.py $repo/params.yaml /dev/null params.yaml "data.source=$A"
  python3 $repo/scripts/overlay.py params.yaml /dev/null pad.yaml train.pad_channels=true
  python3 -m fasttrain download > $w/download.log 2>&1
  timeout 230 python3 -m fasttrain bench --params pad.yaml --case 512:bf16:compile --min-steps 10 \
    --out $w/bench-pad.json > $w/bench-pad.log 2>&1; echo "bench exit $?" >> $w/phases.txt )
grep -v -i warn $w/bench-pad.log | grep -E "images/s|host" | tail -6
stamp B-queue
timeout 600 bash scripts/gpu_repro.sh $A $w/queue 480 --queue 4 > $w/queue-stdout.txt 2>&1
echo "queue repro exit $?" | tee -a $w/phases.txt
grep -E "exit status|Success|Failed|Queued|Running" $w/queue/repro.log | tail -16
stamp C-fast
left=$((deadline - SECONDS))
if [ $left -gt 60 ]; then
  for g in 1 2 3; do
    ( export CUDA_VISIBLE_DEVICES=$g; FT_BASE=/tmp/ft-base$g NO_TESTS=1 timeout $left bash scripts/gpu_fast.sh $A $w/fast$g \
        "$((g - 1))" "train.pad_channels=true" skip-bench > $w/fast$g.log 2>&1 ) &
  done
  wait
fi
stamp end
cat $w/fast*/fast.jsonl 2>/dev/null | cut -c1-260
cd $w && tar czf $o/s6b.tar.gz --exclude='*.pt' . && cp phases.txt bench-pad.log $o/ 2>/dev/null
