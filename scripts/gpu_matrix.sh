#!/usr/bin/env bash
# On the GPU machine (no DVC there): the commands of dvc.yaml's stages in dvc.yaml's order, for all
# 12 variants, over ARCHIVE, with "k=v ..." overrides on params.yaml; results copied to OUTDIR.
set -u
archive=$(realpath "$1"); out=$(realpath -m "$2"); shift 2
repo=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=$repo/src PYTHONUNBUFFERED=1
w=/tmp/ft-matrix && rm -rf $w && mkdir -p $w $out && cd $w
python3 "$repo/scripts/overlay.py" "$repo/params.yaml" /dev/null params.yaml "data.source=$archive" "$@"
python3 -m fasttrain download
for p in single dp ddp; do for q in fp32 autocast amp bf16; do
  python3 -m fasttrain train --parallel $p --precision $q 2>&1 | grep -v "Warning\|warn(" | tail -2
  python3 -m fasttrain evaluate --parallel $p --precision $q
done; done
python3 -m fasttrain compare | tee $out/compare.md
cp metrics/compare.json $out/ && tar czf $out/metrics.tgz metrics plots params.yaml
