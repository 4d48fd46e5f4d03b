"""The folder a process's GPU work runs in, so that the CUDA driver's JIT cache finds its kernels.

cuDNN's autotuning (train.cudnn_benchmark) tries algorithms whose kernels are compiled as the process
runs, and the CUDA driver keeps what it compiled in its JIT cache (~/.nv/ComputeCache). It found them
there only when the process stood in a folder in which such a step had run before. AlexNet's first
bf16 step at batch 512, 227 px, in a folder seen before: 0.97-1.42 s; in a new one: 3.63-5.41 s
(4.02 s when the process had started in a known folder but stepped in a new one, 1.03 s the other way
round: it is the folder at the time of the step). One H100, torch 2.11, cuDNN 9.19, 2026-12-06
(docs/results/alexnet_h100_2026-12-06_kernel-folder/). Every `make fast` runs in a new temporary
folder (DVC's `exp run --temp`), and every new repository is a new folder.

So the GPU work that meets new shapes (training's warm-up, and each evaluation) runs in one folder of
fasttrain's cache, the same for every run of this user, and the process goes back to its own folder
after it. Nothing in those stretches opens a file by a relative path; the variables naming torch's
compile caches are made absolute first, in case one is relative. On the CPU too, so the tests run the
same path. Where the cache folder cannot be made, the work stays where it is."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from fasttrain.layout import user_cache

# Folders torch's compiler reads from the environment as it works: a relative one would move with the process.
PATH_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_COMPILE_DEBUG_DIR")


_lock = threading.Lock()
_inside = 0  # blocks running in the folder now (nested, or in threads: the process has one folder)
_home = ""  # the process's own folder, to go back to when the last one ends


@contextlib.contextmanager
def kernel_folder() -> Iterator[None]:
    """Runs the block in the cache's folder for GPU work, then back in the process's own folder."""
    global _inside, _home
    folder = user_cache("kernels")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        yield
        return
    with _lock:
        if _inside == 0:
            _home = os.getcwd()
            for name in PATH_VARIABLES:
                value = os.environ.get(name)
                if value and not os.path.isabs(value):
                    os.environ[name] = os.path.abspath(value)
            os.chdir(folder)
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0:
                os.chdir(_home)
