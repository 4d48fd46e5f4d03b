# Where a train (then an evaluate) process's exit goes, after its metrics: run from a checkout with this file
# and exitprobe/ in .data/, in a repository whose download stage has run: python3 .data/exit_probe.py REPO N
import json, os, subprocess, sys, time
repo, n = sys.argv[1], int(sys.argv[2])
env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(".data/exitprobe"), os.environ.get("PYTHONPATH", "")]))
for cmd in (["train", "--parallel", "single", "--precision", "bf16"], ["evaluate", "--parallel", "single", "--precision", "bf16"]):
    for i in range(n):
        p = subprocess.Popen(["fasttrain", *cmd], cwd=repo, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        err = p.communicate()[0 if False else 1]
        ended = time.perf_counter()
        line = [l for l in err.splitlines() if l.startswith("EXITPROBE")][-1]
        f = dict(kv.split("=") for kv in line.split()[1:])
        kind = "train" if cmd[0] == "train" else "eval"
        d = json.load(open(f"{repo}/diagnostics/{kind}/seed0/single-bf16.json"))
        metrics_at = float(f["started"]) + d["process_seconds"]["total"]
        print(f"{cmd[0]} run {i}: metrics->last atexit {float(f['atexit_last']) - metrics_at:.3f} s, "
              f"last atexit->exit seen {ended - float(f['atexit_last']):.3f} s, rc {p.returncode}", flush=True)
