"""Instructions per output value of the gpu loader's Triton kernel, compiled for a GPU without one.

    python scripts/gpu/kernel_sass.py [--arch 90] [--block N] [FILE ...]

Compiles `src/fasttrain/batch_kernel.py`'s kernel (or the same kernel in each FILE, e.g. an older
version from `git show REV:src/fasttrain/batch_kernel.py > old.py`) ahead of time for sm_ARCH with
Triton's own compiler and ptxas, disassembles it, and counts the SASS instructions one thread runs
(the kernel has no loops, so that count is the per-thread work). Times threads per program over
output values per program, that is the work per value, for the loader's case in docs/loader-kernel.md: batch of 32 px RGB
images, augmented, resized to 227 px, bf16, channels_last (an older kernel that could pad the output
with zero channels is counted unpadded). A count, not a timing: it says where a change moves the arithmetic, and the GPU has the last
word.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.tools.disasm import get_sass

REPO = Path(__file__).resolve().parents[2]
CASE = {"C": 3, "H": 32, "W": 32, "OH": 227, "OW": 227, "PAD": 4, "AUGMENT": True, "NHWC": True}
POINTERS = {"src": "*u8", "idx": "*i64", "dy": "*i64", "dx": "*i64", "flip": "*i64", "out": "*bf16"}
NUM_WARPS = 4  # Triton's default, which the loader launches with
INSTRUCTION = re.compile(r"^[-0-9a-f]{2}:[-0-9]:[-0-9]:[-Y]:[0-9a-f]+\t(?!.*\bNOP\b)")


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"kernel_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compiled_sass(kernel, signature: dict, consts: dict, arch: int) -> str:
    """The kernel's SASS for sm_ARCH, compiled ahead of time by Triton's compiler and ptxas with
    NUM_WARPS warps; `consts` are its constexpr arguments by name."""
    names = kernel.arg_names
    source = ASTSource(fn=kernel, signature=signature, constexprs={(names.index(k),): v for k, v in consts.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": NUM_WARPS})
    return get_sass(compiled.asm["cubin"])


def instructions(sass: str) -> int:
    """SASS instructions, NOPs left out."""
    return sum(1 for line in sass.splitlines() if INSTRUCTION.match(line))


def per_value(path: Path, arch: int, block: int | None) -> tuple[int, int, float]:
    module = load_module(path)
    kernel = module._kernel()
    names = kernel.arg_names
    block = block or module.BLOCK
    per_pixel = "n_pix" in names  # a program makes BLOCK pixels x C channels; else BLOCK values
    unpadded = {"C_OUT": CASE["C"], "TILE": False, "CP": triton.next_power_of_2(CASE["C"])}  # older kernels' padding
    consts = {**CASE, **unpadded, "BLOCK": block, **({"WIDE": False} if "WIDE" in names else {})}
    consts = {k: v for k, v in consts.items() if k in names}
    signature = {}
    for name in names:
        if name in consts:
            signature[name] = "constexpr"
        elif name in POINTERS:
            signature[name] = POINTERS[name]
        elif name.startswith("scale"):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"  # the element / pixel count
    count = instructions(compiled_sass(kernel, signature, consts, arch))
    values = block * CASE["C"] if per_pixel else block
    return count, values, count * NUM_WARPS * 32 / values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, default=[REPO / "src/fasttrain/batch_kernel.py"])
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper)")
    parser.add_argument("--block", type=int, default=None, help="BLOCK instead of the module's")
    args = parser.parse_args()
    for path in args.files:
        count, values, each = per_value(path, args.arch, args.block)
        print(f"{path}: {count} instructions per thread, {values} output values per program of "
              f"{NUM_WARPS * 32} threads: {each:.1f} thread-instructions per output value (sm_{args.arch})")


if __name__ == "__main__":
    main()
