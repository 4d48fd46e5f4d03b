#!/bin/bash
# The runs of repro.md, fast-first.md, fast-copy.log, fast-hardlink.log, ddp-timeline.log and the DVC floor
# (steps.txt), on one fresh host, from a copy of the checkout (db47ef6) with DVC's wheels in .whl/ and
# the CIFAR-10 archive in .data/: `bash run.sh` under scripts/gpu/detached.sh, results in /tmp/r.
set -u
P0=$PATH src=$PWD out=$OUT archive=$PWD/.data/cifar10-jpeg.tar.gz r=/tmp/r
mkdir -p $r
SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/pip.log 2>&1
echo "pip rc $? in $SECONDS s" | tee -a $r/steps.log
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 FT_TIME=1
export TORCHINDUCTOR_CACHE_DIR=$HOME/.cache/fasttrain/torchinductor
nvidia-smi -L > $r/machine.txt; nproc >> $r/machine.txt; df -h /tmp >> $r/machine.txt
for s in 1; do
  extra=; [ $s = 2 ] && extra="--cprofile-dump $r/fast2.prof"
  t=$SECONDS; FT_TARGETS=download FT_FAST_EXTRA="$extra" bash scripts/gpu/repro.sh $archive /tmp/w $r/F$s 200 --fast $s > $r/F$s.txt 2>&1
  echo "F$s rc $? in $((SECONDS - t)) s (at $SECONDS s)" | tee -a $r/steps.log
done
cd /tmp/w
cd /tmp/w
export PATH=/tmp/w/.dvc/tmp/bin:$PATH PYTHONPATH=/tmp/w/src:/tmp/site
flags=$(python3 scripts/overlay.py --dvc-flags recipes/fast.yaml)
git config user.name fasttrain; git config user.email fasttrain@localhost
stamp() { python3 -c "
import sys,time
s=float(sys.argv[1]); last=0
for l in sys.stdin:
    t=time.time()-s
    if ': epoch ' in l: continue
    print(f'{t:7.3f} +{t-last:5.2f}', l.rstrip()[:220]); last=t
" "$1"; }
for s in 3 4; do
  if [ $s = 3 ]; then dvc config --unset cache.type && git commit -qam "copy cache"; fi  # DVC's default
  if [ $s = 4 ]; then dvc config cache.type hardlink,copy && git commit -qam "hardlink cache"; fi
  dvc config cache.type >> $r/steps.log 2>&1
  a=$(date +%s.%N)
  python3 -m fasttrain serve -- dvc exp run -v --temp $flags -S "compare.seeds=[$s]" train@single-bf16-$s evaluate@single-bf16-$s 2>&1 | stamp $a > $r/F${s}v.txt
  echo "F$s verbose $(awk "BEGIN{print $(date +%s.%N) - $a}") s" | tee -a $r/steps.log
  a=$(date +%s.%N); python3 -m fasttrain experiments --variant single-bf16 --param train.epochs --param compare.seeds > $r/exps$s.txt 2>&1
  echo "experiments table $(awk "BEGIN{print $(date +%s.%N) - $a}") s" | tee -a $r/steps.log
done
cd /tmp/w
export PATH=/tmp/w/.dvc/tmp/bin:$PATH PYTHONPATH=/tmp/w/src:/tmp/site
flags=$(python3 scripts/overlay.py --dvc-flags recipes/fast.yaml)
for i in 1 2; do  # DVC's floor: an experiment of the fast flags in which no stage runs
  a=$(date +%s.%N); dvc exp run --temp $flags -S "compare.seeds=[$((7 + i))]" download > $r/floor$i.txt 2>&1
  echo "floor$i rc $? $(awk "BEGIN{print $(date +%s.%N) - $a}") s" | tee -a $r/steps.log
done
a=$(date +%s.%N); dvc exp run --temp --cprofile-dump $r/floor.prof $flags -S "compare.seeds=[12]" download > $r/floor3.txt 2>&1
echo "floor3 (profiled) rc $? $(awk "BEGIN{print $(date +%s.%N) - $a}") s" | tee -a $r/steps.log
# ddp: a timeline of the launcher, the teardown timed
python3 scripts/overlay.py params.yaml /dev/null params.yaml train.epochs=1
python3 - <<'PY'
import re, pathlib
p = pathlib.Path("src/fasttrain/parallel.py"); s = p.read_text()
s = s.replace("        dist.destroy_process_group()\n", "        import time as _t; _a = _t.perf_counter(); dist.destroy_process_group()\n        print(f'PROBE teardown {_t.perf_counter() - _a:.3f} s', file=sys.stderr, flush=True)\n")
p.write_text(s)
PY
grep -c PROBE src/fasttrain/parallel.py >> $r/steps.log
cat > /tmp/tl.sh <<'SH'
s=$(date +%s.%N)
fasttrain $1 --parallel ddp --precision bf16 --seed 0 2>&1 | python3 -c "
import sys,time
s=$s
for l in sys.stdin: print(f'{time.time()-s:7.3f}', l.rstrip()[:150])
"
echo "exit after $(awk "BEGIN{print $(date +%s.%N) - $s}") s"
python3 -c "import json;d=json.load(open('diagnostics/$2/seed0/ddp-bf16.json'));print('process_seconds', d['process_seconds'])"
SH
LOGLEVEL=INFO timeout 200 python3 -m fasttrain serve -- bash -c 'for c in train evaluate train evaluate; do [ $c = train ] && d=train || d=eval; bash /tmp/tl.sh $c $d; done' > $r/ddp.txt 2>&1
echo "ddp done at $SECONDS s" | tee -a $r/steps.log
for f in floor; do python3 -c "import pstats; p=pstats.Stats('$r/$f.prof'); p.sort_stats('cumulative').print_stats(150)" > $r/$f.txt 2>&1; done
# the 12 variants at 1 epoch in a fresh repository (this host's compile cache is warm; classic does not compile)
cd $src
export PATH=$P0 PYTHONPATH=/tmp/site
t=$SECONDS; bash scripts/gpu/repro.sh $archive /tmp/w1 $r/A 330 train.epochs=1 > $r/A.txt 2>&1
echo "A rc $? in $((SECONDS - t)) s (at $SECONDS s)" | tee -a $r/steps.log
