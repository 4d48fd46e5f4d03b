# when a fasttrain process's last atexit handler runs
import atexit, os, sys, time
def _last():
    f = sys.modules.get("fasttrain")
    print(f"EXITPROBE pid={os.getpid()} atexit_last={time.perf_counter():.3f} started={getattr(f, 'STARTED', 0):.3f}",
          file=sys.__stderr__, flush=True)
atexit.register(_last)  # registered first: runs last
