#!/usr/bin/env bash
# session 6, call 1 (nvidia-h200): fasttrain bench alone on the machine, then where the compiled
# batch-512 bf16 step spends its time and which knobs move it. Results: /tmp/ftd/out/s6a.tar.gz.
repo=$PWD; export PYTHONUNBUFFERED=1 PYTHONPATH=$repo/src; w=/tmp/ftd/w; o=/tmp/ftd/out; mkdir -p $w $o
A=$repo/.cache/cifar10-jpeg.tar.gz; t0=$SECONDS
stamp() { echo "PHASE $1 at $((SECONDS - t0)) s $(date -u +%T)" | tee -a $w/phases.txt; }
stamp start
{ nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv; nproc; uptime
  python3 -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())'; } > $w/machine.txt 2>&1
b=/tmp/ftb; mkdir -p $b; cd $b
python3 $repo/scripts/overlay.py $repo/params.yaml /dev/null params.yaml "data.source=$A"
python3 -m fasttrain download > $w/download.log 2>&1
stamp bench
timeout 330 python3 -m fasttrain bench --params params.yaml --case 64:amp --case 512:bf16:compile --out $w/bench.json > $w/bench.log 2>&1
echo "bench exit $?" >> $w/phases.txt
stamp sweep
n=0
for c in "512:bf16:compile=true" "512:bf16:compile=true,cudnn_limit=0" "512:bf16:compile=true,channels_last=false" \
         "512:bf16:compile=false" "512:bf16:compile=true,compile_mode=max-autotune-no-cudagraphs,inductor.max_autotune_conv_backends=ATEN"; do
  n=$((n + 1)); PROFILE_TOP=25 timeout 200 python3 $repo/scripts/gpu_sweep.py params.yaml $w/sweep-$n.json "$c" 2>&1 \
    | grep -v -i -e warn -e autotun -e triton_ -e "^  mm " -e "^strides" -e "^dtypes" -e USDT -e "profiler =" >> $w/sweep.log
  stamp "sweep-$n"
done
cd $w && tar czf $o/s6a.tar.gz . && cp bench.log sweep.log phases.txt $o/
stamp end
