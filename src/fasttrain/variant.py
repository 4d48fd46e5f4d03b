"""What `train` and `evaluate` share: the variant options, validation before anything starts, and
starting torchrun workers when a ddp variant is asked for outside torchrun."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from fasttrain import clock, config, parallel
from fasttrain.data import require_dataset
from fasttrain.layout import Layout
from fasttrain.precision import PRECISIONS


def variant_options(fn):
    @click.option("--parallel", "parallel_name", required=True, type=click.Choice(tuple(parallel.MODES)),
                  help="single: one device; dp: nn.DataParallel over the visible GPUs; "
                       "ddp: DistributedDataParallel, one torchrun process per GPU (2 gloo processes without one).")
    @click.option("--precision", "precision_name", required=True, type=click.Choice(tuple(PRECISIONS)),
                  help="fp32; autocast: fp16 autocast, no scaler; amp: fp16 autocast + GradScaler; bf16: bf16 autocast.")
    @click.option("--seed", type=click.IntRange(min=0), default=None,
                  help="The run's seed, one of compare.seeds (dvc.yaml's matrix passes it); default: the first of them. "
                       "Its outputs go under seed<N>/ (models/seed0/single-fp32.pt).")
    @click.option("--params", "params_path", default="params.yaml", show_default=True,
                  type=click.Path(dir_okay=False), help="The params file to read.")
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


def seed_or_first(seed: int | None, params: config.Params) -> int:
    """--seed, or the first of compare.seeds when it is not given."""
    return params.compare.seeds[0] if seed is None else seed


def world_size_for(params: config.Params, parallel_name: str, nnodes: int = 1) -> int:
    if not parallel.MODES[parallel_name].processes:
        return 1
    if parallel.under_torchrun():
        return parallel.current_world_size()
    device = parallel.resolve_device(params.train.device)
    nproc = params.train.nproc or parallel.default_nproc()
    parallel.check_nproc(nproc, device.type)
    return nnodes * nproc


def run_variant(command: str, fn, parallel_name: str, precision_name: str, seed: int | None, params_path: str,
                check=None, max_restarts: int = 0, extra_argv: tuple[str, ...] = ()) -> None:
    """Validate (`check(params, world_size)`), then either run `fn(params, precision, runtime, layout)`
    for the run of `seed` (None: the first of compare.seeds)
    here or start ddp workers that run this same command (plus `extra_argv`) under torchrun.

    Only `train` spreads over `train.nnodes` nodes: evaluating 10,000 images needs no second node, and
    the evaluate stage does not read train.nnodes (it counts every image once at any world size)."""
    clock.begin()
    params = config.load(params_path)
    seed = seed_or_first(seed, params)
    params = params.for_seed(seed)
    processes = parallel.MODES[parallel_name].processes
    nnodes = params.train.nnodes if command == "train" and processes else 1
    world_size = world_size_for(params, parallel_name, nnodes)
    if check is not None:
        check(params, world_size)
    if processes and not parallel.under_torchrun():
        require_dataset(Layout().dataset)  # here, once, not in every worker
        parallel.launch([command, "--parallel", parallel_name, "--precision", precision_name, "--seed", str(seed),
                         "--params", str(Path(params_path).resolve()), *extra_argv], world_size // nnodes,
                        max_restarts, device=params.train.device, nnodes=nnodes,
                        run_id=f"fasttrain-{command}-{parallel_name}-{precision_name}-{seed}")
        return
    with clock.phase("runtime"):  # the GPU lease, CUDA's start, the process group
        rt = parallel.setup(parallel_name, params.train.device, params.train.nproc)
    parallel.silence_non_main(rt)
    layout = Layout(seed=seed)
    try:
        with parallel.peers_lost_as_errors(rt):
            parallel.check_same_file(layout.dataset, rt)
            fn(params, PRECISIONS[precision_name], rt, layout)
    finally:
        parallel.teardown(rt)
