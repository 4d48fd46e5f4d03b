#!/bin/bash
# which part of a process's path makes cuDNN's autotuning compile afresh
set -u
cc() { du -sk ~/.nv/ComputeCache 2>/dev/null | cut -f1; }
mkdir -p /tmp/j/a /tmp/j/b /tmp/j/c /tmp/j/d /tmp/j/s /tmp/j/s2
cp first_step.py /tmp/j/s/first_step.py; cp first_step.py /tmp/j/s2/first_step.py
nvidia-smi -L; python3 -c 'import torch; print(torch.__version__, torch.backends.cudnn.version())'
echo "cache $(cc)"
(cd /tmp/j/a && PWD=/tmp/j/a python3 /tmp/j/s/first_step.py r1-a-first); echo "cache $(cc)"
(cd /tmp/j/a && PWD=/tmp/j/a python3 /tmp/j/s/first_step.py r2-a-again); echo "cache $(cc)"
(cd /tmp/j/b && PWD=/tmp/j/b python3 /tmp/j/s/first_step.py r3-b-new-folder); echo "cache $(cc)"
(cd /tmp/j/c && PWD=/tmp/j/a python3 /tmp/j/s/first_step.py r4-c-with-PWD-of-a); echo "cache $(cc)"
(cd /tmp/j/a && PWD=/tmp/j/a python3 /tmp/j/s2/first_step.py r5-a-script-elsewhere); echo "cache $(cc)"
(cd /tmp/j/a && PWD=/tmp/j/a FOO=1 python3 /tmp/j/s/first_step.py r6-a-another-variable); echo "cache $(cc)"
(cd /tmp/j/d && env -u PWD python3 /tmp/j/s/first_step.py r7-d-no-PWD); echo "cache $(cc)"
(cd /tmp/j/b && PWD=/tmp/j/b python3 /tmp/j/s/first_step.py r8-b-again); echo "cache $(cc)"
ls -la ~/.nv/ComputeCache 2>/dev/null | head; env | grep -i -E "cuda|nv|cache" | head -20
