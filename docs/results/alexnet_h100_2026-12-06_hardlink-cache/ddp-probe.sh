#!/bin/bash
# The runs of probes.txt and ddp-launcher-ab.txt, on a second fresh host, from the same checkout (db47ef6):
# ddp launches with the c10d rendezvous's event names read by inspect.stack() (as torch does) and by a frame
# walk (FASTTRAIN_PATCH=1, in a copy of the sources); the H200 branch at the end did not run (an H100 came).
set -u
P0=$PATH src=$PWD archive=$PWD/.data/cifar10-jpeg.tar.gz r=/tmp/r
mkdir -p $r
SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/pip.log 2>&1
echo "pip rc $? in $SECONDS s" | tee -a $r/steps.log
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 FT_TIME=1
export TORCHINDUCTOR_CACHE_DIR=$HOME/.cache/fasttrain/torchinductor
nvidia-smi -L | tee $r/machine.txt; nvidia-smi -q | grep -i "persistence\|compute mode" >> $r/machine.txt
python3 - > $r/probes.txt 2>&1 <<'PY'
import time, sys, inspect
a = time.perf_counter(); import torch, torch._dynamo, torch.distributed.run; b = time.perf_counter()
print(f"imports {b - a:.2f} s, {len(sys.modules)} modules")
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as d
def deep(n):
    if n: return deep(n - 1)
    a = time.perf_counter(); [d.get_method_name() for _ in range(9)]; b = time.perf_counter()
    print(f"9 x get_method_name at depth {n}: {b - a:.3f} s")
deep(12); deep(12)
a = time.perf_counter(); torch.cuda.device_count(); b = time.perf_counter()
torch.cuda.get_device_properties(0); c = time.perf_counter()
print(f"device_count {b - a:.3f} s, get_device_properties (CUDA init) {c - b:.3f} s")
PY
cat $r/probes.txt
t=$SECONDS; FT_TARGETS="train@ddp-bf16-0" bash scripts/gpu/repro.sh $archive /tmp/w $r/P 150 train.epochs=1 > $r/P.txt 2>&1
echo "P rc $? in $((SECONDS - t)) s" | tee -a $r/steps.log
cd /tmp/w
export PATH=/tmp/w/.dvc/tmp/bin:$P0 PYTHONPATH=/tmp/w/src:/tmp/site
python3 - <<'PY'
import pathlib
p = pathlib.Path("src/fasttrain/parallel.py"); s = p.read_text()
s = s.replace("""    os.environ[LAUNCHER_PID] = str(os.getpid())  # die_with_launcher
""", """    os.environ[LAUNCHER_PID] = str(os.getpid())  # die_with_launcher
    if os.environ.get("FASTTRAIN_PATCH") == "1":
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous
        def _name(depth=2):
            try:
                return sys._getframe(depth).f_code.co_name
            except ValueError:
                return "no_method_name"
        dynamic_rendezvous.get_method_name = _name
""")
p.write_text(s)
PY
grep -c FASTTRAIN_PATCH src/fasttrain/parallel.py >> $r/steps.log
cat > /tmp/one.sh <<'SH'
s=$(date +%s.%N)
fasttrain $1 --parallel ddp --precision bf16 --seed 0 > /tmp/one.out 2>&1; rc=$?
e=$(date +%s.%N)
python3 -c "
import json; d=json.load(open('diagnostics/$2/seed0/ddp-bf16.json')); t=d['process_seconds']['total']
print('$1 patch=${FASTTRAIN_PATCH:-0} rc $rc wall', round($e-$s,3), 'process', t, 'around', round($e-$s-t,3))"
SH
timeout 150 python3 -m fasttrain serve -- bash -c 'sleep 3; for i in 1 2 3 4 5; do FASTTRAIN_PATCH=0 bash /tmp/one.sh evaluate eval; FASTTRAIN_PATCH=1 bash /tmp/one.sh evaluate eval; done; for i in 1 2; do FASTTRAIN_PATCH=0 bash /tmp/one.sh train train; FASTTRAIN_PATCH=1 bash /tmp/one.sh train train; done' > $r/ab.txt 2>&1
echo "ab done at $SECONDS s" | tee -a $r/steps.log
cd $src
export PATH=$P0 PYTHONPATH=/tmp/site
if nvidia-smi -L | grep -q H200; then
  t=$SECONDS; bash scripts/gpu/repro.sh $archive /tmp/w1 $r/A 330 --fast "1 2" train.epochs=1 > $r/A.txt 2>&1
  echo "A rc $? in $((SECONDS - t)) s (at $SECONDS s)" | tee -a $r/steps.log
fi
