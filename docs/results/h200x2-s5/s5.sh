#!/usr/bin/env bash
# session 5, nvidia-h200-x2, one detached job. Each phase leaves a tarball in /tmp/ftd/out.
repo=$PWD; export PYTHONUNBUFFERED=1; o=/tmp/ftd/out; w=/tmp/ftd/w; mkdir -p $o $w
A=$repo/.cache/cifar10-jpeg.tar.gz; t0=$SECONDS; deadline=$((t0 + ${JOB_SECONDS:-1480}))
stamp() { echo "PHASE $1 at $((SECONDS - t0)) s $(date -u +%T)" | tee -a $o/phases.txt; }
pack() { tar czf $o/$1.tar.gz -C $w $1; }
stamp 0-start
mkdir -p $w/p0; { nvidia-smi -L; nvidia-smi topo -m; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.device_count())'; } > $w/p0/machine.txt 2>&1
(PYTHONPATH=$repo/src timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/unit 2>&1 | tail -15) > $w/p0/pytest.txt
(PYTHONPATH=$repo/src timeout 60 python3 scripts/checkpoint_time.py /tmp/ftd --rounds 4) > $w/p0/checkpoint.txt 2>&1
(timeout 60 torchrun --nproc-per-node 2 .run/allreduce.py) > $w/p0/allreduce.txt 2>&1
pack p0; cat $w/p0/pytest.txt | tail -3; grep ALLREDUCE $w/p0/allreduce.txt
stamp 1-bench-fast
mkdir -p $w/p1
( export CUDA_VISIBLE_DEVICES=1; NO_TESTS=1 timeout 420 bash scripts/gpu_fast.sh $A $w/p1/fastA "0 1 2" \
   "train.epochs=21,train.progressive_epochs=8,train.progressive_size=160" skip-bench > $w/p1/fastA.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$repo/src; b=/tmp/ftd/bench; mkdir -p $b && cd $b
  python3 $repo/scripts/overlay.py $repo/params.yaml /dev/null params.yaml "data.source=$A"
  timeout 120 python3 -m fasttrain download > $w/p1/bench.log 2>&1
  timeout 240 python3 -m fasttrain bench --params params.yaml --case 64:amp --case 512:bf16:compile --out $w/p1/bench.json >> $w/p1/bench.log 2>&1
  FT_BASE=/tmp/ft-base0 NO_TESTS=1 timeout 300 bash $repo/scripts/gpu_fast.sh $A $w/p1/fastB "0 1 2" \
   "train.epochs=22,train.progressive_epochs=10,train.progressive_size=160" skip-bench > $w/p1/fastB.log 2>&1 ) &
wait; pack p1; grep -h -v -i warn $w/p1/bench.log | grep -E "gpu_loader|ceiling|workers_0|/" | tail -12; grep -h FAST $w/p1/fast*.log | cut -c1-200
stamp 2-queue
mkdir -p $w/p2; timeout 900 bash scripts/gpu_repro.sh $A $w/p2 780 --queue 2 > $w/p2/stdout.txt 2>&1; echo "queue repro exit $?" | tee -a $o/phases.txt
pack p2; grep -E "exit status|Success|Failed|Queued|Running" $w/p2/repro.log | tail -16
stamp 3-multi
left=$((deadline - SECONDS)); mkdir -p $w/p3; RUN_SECONDS=120 timeout $((left < 330 ? (left > 60 ? left : 60) : 330)) bash scripts/gpu_multi.sh $A $w/p3 3 \
  "ddp:amp:64:1 ddp:amp:128:2 dp:amp:128 ddp:bf16:512:1 ddp:bf16:1024:2 dp:bf16:1024" > $w/p3/multi.log 2>&1
left=$((deadline - SECONDS))
[ $left -gt 420 ] && RUN_SECONDS=150 timeout 330 bash scripts/gpu_multi.sh $A $w/p3 2 "ddp:amp:64:2:torchvision dp:amp:64:torchvision" > $w/p3/multi-tv.log 2>&1
pack p3; grep MULTI $w/p3/multi.log | cut -c1-220
left=$((deadline - SECONDS))
if [ $left -gt 200 ]; then
  stamp 4-repro-nproc2
  mkdir -p $w/p4; FT_WORK=/tmp/ft-repro2 FT_TARGETS="evaluate@ddp-amp evaluate@ddp-bf16 evaluate@ddp-autocast evaluate@ddp-fp32 evaluate@dp-amp evaluate@dp-bf16 evaluate@dp-autocast evaluate@dp-fp32" \
    timeout $((left + 90)) bash scripts/gpu_repro.sh $A $w/p4 $((left - 20)) train.nproc=2 > $w/p4/stdout.txt 2>&1
  pack p4; grep -E "Running stage|epoch 20/|exit status" $w/p4/repro.log | tail -20
fi
stamp 5-end
