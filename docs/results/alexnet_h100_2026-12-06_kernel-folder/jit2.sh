#!/bin/bash
set -u
cc() { du -sk ~/.nv/ComputeCache 2>/dev/null | cut -f1; }
mkdir -p /tmp/k/a /tmp/k/b /tmp/k/c /tmp/k/d /tmp/k/e
nvidia-smi -L; echo "cache $(cc)"
python3 $PWD/first_step_moved.py q1-cold /tmp/k/a - none; echo "cache $(cc)"
python3 $PWD/first_step_moved.py q1-again /tmp/k/a - none; echo "cache $(cc)"
python3 $PWD/first_step_moved.py q2 /tmp/k/b /tmp/k/a after-init; echo "cache $(cc)"
python3 $PWD/first_step_moved.py q3 /tmp/k/a /tmp/k/c after-init; echo "cache $(cc)"
python3 $PWD/first_step_moved.py q4 /tmp/k/d /tmp/k/a before-init; echo "cache $(cc)"
python3 $PWD/first_step_moved.py q5-root / - none; echo "cache $(cc)"
python3 $PWD/first_step_moved.py q6 /tmp/k/e / after-init; echo "cache $(cc)"
