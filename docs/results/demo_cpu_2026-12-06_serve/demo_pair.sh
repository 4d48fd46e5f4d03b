#!/bin/bash
# `make demo` at fc20394 and at 1bf85b5, back to back, two pairs, each commit in a git worktree of its
# own (git worktree add /tmp/wt-base fc20394; git worktree add --detach /tmp/wt-now 1bf85b5), both
# with the environment of the checkout given: bash demo_pair.sh /path/to/checkout/.venv
V=${1:?usage: demo_pair.sh CHECKOUT/.venv}
for pair in 1 2; do
  for wt in /tmp/wt-base /tmp/wt-now; do
    cd $wt
    s=$(date +%s.%N)
    PATH=$V/bin:$PATH PYTHONPATH=$wt/src make VENV=$V -o $V/.installed demo > /tmp/demo-$(basename $wt)-$pair.log 2>&1
    rc=$?
    e=$(date +%s.%N)
    echo "pair $pair $(basename $wt) $(git rev-parse --short HEAD) rc=$rc $(python3 -c "print(f'{$e-$s:.1f}')") s $(date -u +%H:%M)"
  done
done
