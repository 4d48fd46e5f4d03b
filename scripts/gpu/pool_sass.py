"""The fused pools' Triton kernels compiled ahead of time for a GPU without one: per case, SASS
instructions and a digest of the machine code, to compare versions of `src/fasttrain/pool_triton.py`.

    python scripts/gpu/pool_sass.py [--arch 90] [--dtype bf16] [FILE ...]

Each FILE is a version of pool_triton.py (e.g. `git show REV:src/fasttrain/pool_triton.py > old.py`),
or of pool_kernel.py (whose `_kernels()` returns the two kernels, also from before they had a module
of their own); without one, the repository's pool_triton.py. Cases: forward and backward, for bf16,
fp32 and fp64 tensors (or the one `--dtype`), pools 3/2/0 (AlexNet's), 3/1/1 and 2/2/0
(kernel/stride/padding), channel blocks of 64 (AlexNet's layers) and 16. Each line gives a case's
SASS instructions without NOPs and the first 12 hex digits of the SHA-256 of its whole disassembly
(control codes included), so an equal digest is the same machine code. With two or more files, the
last line says which cases differ from the first file's. A count and a digest, not a timing: the GPU
has the last word on speed.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import sys
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_sass import REPO, compiled_sass, instructions, load_module  # noqa: E402 (this folder's sibling)

sys.path.insert(0, str(REPO / "src"))
from fasttrain.pool_kernel import BLOCK_W, MAX_BLOCK_C  # noqa: E402 (the tiles the kernels are launched with)

DTYPES = ("bf16", "fp32", "fp64")
POOLS = ((3, 2, 0), (3, 1, 1), (2, 2, 0))
BLOCKS_C = (MAX_BLOCK_C, 16)  # AlexNet's layers (64 to 256 channels), a layer of 16


def cases(dtypes):
    for dtype, (k, s, p), block_c, way in itertools.product(dtypes, POOLS, BLOCKS_C, ("forward", "backward")):
        yield f"{way} {dtype} {k}/{s}/{p} c{block_c}", way, dtype, dict(K=k, S=s, P=p, BLOCK_W=BLOCK_W, BLOCK_C=block_c)


def kernels(module) -> tuple:
    """(forward, backward) of a pool_triton.py, or of a pool_kernel.py through its `_kernels()`."""
    if hasattr(module, "_kernels"):
        return module._kernels()
    return module.relu_max_pool_forward, module.relu_max_pool_backward


def machine_code(module, way: str, dtype: str, consts: dict, arch: int) -> tuple[int, str]:
    """(instructions without NOPs, digest) of one kernel compiled for sm_ARCH."""
    forward, backward = kernels(module)
    if way == "forward":
        kernel, pointers = forward, {"x": dtype, "out": dtype, "arg": "i8"}
    else:
        kernel, pointers = backward, {"grad_out": dtype, "arg": "i8", "grad_in": dtype}
        consts = {**consts, "FLOAT64": dtype == "fp64"}
    signature = {n: f"*{pointers[n]}" if n in pointers else "constexpr" if n in consts else "i32"
                 for n in kernel.arg_names}
    sass = compiled_sass(kernel, signature, consts, arch)  # 4 warps: Triton's default, which pool_kernel launches with
    return instructions(sass), hashlib.sha256(sass.encode()).hexdigest()[:12]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, default=[REPO / "src/fasttrain/pool_triton.py"])
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper)")
    parser.add_argument("--dtype", choices=DTYPES, default=None, help="only this tensor type's cases")
    args = parser.parse_args()
    modules = [load_module(path) for path in args.files]
    todo, differ = list(cases([args.dtype] if args.dtype else DTYPES)), []
    for name, way, dtype, consts in todo:
        codes = [machine_code(module, way, dtype, consts, args.arch) for module in modules]
        print(f"{name}: " + "; ".join(f"{count} instructions, sass {digest}" for count, digest in codes), flush=True)
        if any(digest != codes[0][1] for _, digest in codes[1:]):
            differ.append(name)
    if len(modules) > 1:
        print(f"{len(differ)} of {len(todo)} cases differ from {args.files[0]}'s machine code (sm_{args.arch}, "
              f"Triton {triton.__version__})" + (f": {', '.join(differ)}" if differ else ""))


if __name__ == "__main__":
    main()
