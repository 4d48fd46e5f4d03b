"""`fasttrain bench`: where the time goes, measured in one process at the same batch size and precision.

For each case (batch size, precision, compiled or not) it times the real training step fed by
  - the classic torchvision loader with 0 workers and with `data.workers` workers,
  - the gpu loader (uint8 set on the device, batched by index),
  - the compute ceiling: the same step on one random batch already on the device,
  - on a GPU, the gpu loader and the ceiling again with the step replayed from CUDA graphs
    (train.cuda_graphs), so the host's kernel launches and the GPU's own time are told apart,
and, once, a bf16 matrix product for the device's peak. Model FLOP utilisation is the step's
counted FLOPs per image x images/s over that peak.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time

import click
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from fasttrain import atomic, batch_kernel, config, graphs, parallel, switches
from fasttrain.data import load_dataset
from fasttrain.engine import (StepLog, build_trainable, random_batch, synchronize,
                              train_step, warm_up)
from fasttrain.errors import FasttrainError
from fasttrain.layout import Layout
from fasttrain.loaders import input_dtype, loader_args, make_train_loader
from fasttrain.models import build_model, check_img_size
from fasttrain.precision import PRECISIONS

DEFAULT_CASES = ("64:amp", "512:bf16:compile")


@dataclasses.dataclass(frozen=True)
class Case:
    batch_size: int
    precision: str
    compile: bool
    compile_mode: str | None = None  # None: train.compile_mode from the params

    @property
    def name(self) -> str:
        compiled = f", compiled ({self.compile_mode})" if self.compile_mode else ", compiled"
        return f"batch {self.batch_size}, {self.precision}" + (compiled if self.compile else "")


def parse_case(text: str) -> Case:
    parts = text.split(":")
    flag, _, mode = parts[2].partition("=") if len(parts) == 3 else ("", "", "")
    ok = (2 <= len(parts) <= 3 and parts[0].isdigit() and int(parts[0]) >= 1 and parts[1] in PRECISIONS
          and (len(parts) == 2 or (flag == "compile" and (not mode or mode in config.COMPILE_MODES))))
    if not ok:
        raise FasttrainError(f"bad bench case '{text}': use BATCH:PRECISION[:compile[=MODE]], precision one of "
                             f"{', '.join(PRECISIONS)}, MODE one of {', '.join(config.COMPILE_MODES)}, "
                             f"e.g. 64:amp or 512:bf16:compile")
    return Case(int(parts[0]), parts[1], len(parts) == 3, mode or None)


def flops_per_image(model_name: str, img_size: int, num_classes: int) -> float:
    """Forward + backward FLOPs of one image, counted by torch's FlopCounterMode (matmuls and convs)."""
    model = build_model(model_name, num_classes)
    x = torch.randn(2, 3, img_size, img_size)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), torch.zeros(2, dtype=torch.long)).backward()
    return counter.get_total_flops() / 2


def matmul_peak_tflops(device: torch.device, size: int, repeats: int = 20, dtype=torch.bfloat16) -> float:
    """Matrix-product throughput (bf16 unless told) on random data (zeros run faster than real data)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e12


def time_steps(step, batches, warmup_steps: int, min_steps: int, min_seconds: float, device) -> dict:
    """Images/s of `step` over `batches` (an endless iterator), warm-up excluded, device synchronised."""
    for _ in range(warmup_steps):
        step(*next(batches))
    synchronize(device)
    start, steps, images = time.perf_counter(), 0, 0
    while steps < min_steps or time.perf_counter() - start < min_seconds:
        x, y = next(batches)
        step(x, y)
        steps += 1
        images += y.shape[0]
    synchronize(device)
    seconds = time.perf_counter() - start
    return {"images_per_second": round(images / seconds, 1), "steps": steps, "seconds": round(seconds, 3)}


def _endless(loader):
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


@dataclasses.dataclass
class CasePaths:
    """One case's paths, ready to time: name -> (the step, a function that makes its endless batches)."""
    paths: dict
    params: config.Params  # the params as the case sets them (batch size, compile)
    compile_seconds: float  # the warm-up's (torch.compile's, where the case compiles)
    capture_seconds: float | None  # the CUDA graphs' (None: the graphed paths do not run here)
    kernel: bool  # the gpu loader runs its Triton kernel (else tensor ops: a CPU, or the kernel turned off)


def case_paths(params: config.Params, case: Case, dataset, rt: parallel.Runtime) -> CasePaths:
    """The model, warmed up (compiled, where the case compiles) and, where graphs run, captured; and
    the paths that time its step: the torchvision loader with 0 and with data.workers workers, the
    gpu loader, the compute ceiling, and the last two replayed from CUDA graphs."""
    train = dataclasses.replace(params.train, batch_size=case.batch_size, compile=case.compile,
                                compile_mode=case.compile_mode or params.train.compile_mode, cuda_graphs=True)
    params = dataclasses.replace(params, train=train)
    cfg, precision, plan = params.train, PRECISIONS[case.precision], switches.decide(params, rt)
    torch.backends.cudnn.benchmark = plan.cudnn_benchmark
    graphed = plan.cuda_graphs  # the graphed paths, where graphs can run
    t = build_trainable(params, precision, rt, len(dataset.classes), graphs=graphed)
    steps = StepLog(1024, rt.device, t.scaler)

    def step(x, y):  # exactly what the training loop does per step, eagerly
        loss, grad_norm = train_step(t, precision, x, y)
        steps.record(loss, y.shape[0], grad_norm)

    dtype = input_dtype(params, precision)  # what the gpu loader hands the model
    x0, y0 = random_batch(case.batch_size, cfg.img_size, len(dataset.classes), rt.device, dtype, cfg.channels_last)
    last = len(dataset.train_labels) % case.batch_size  # the short last batch of an epoch
    compile_seconds = warm_up(t, precision, [case.batch_size, last], cfg.img_size, len(dataset.classes),
                              cfg.channels_last, rt.device, dtype)
    capture_seconds = None
    if graphed:  # the same step replayed from CUDA graphs, as train.cuda_graphs runs it
        graph_step = graphs.GraphedStep(t, precision, rt)
        capture_seconds = graph_step.capture([(case.batch_size, cfg.img_size), (last, cfg.img_size)],
                                             len(dataset.classes), cfg.channels_last, dtype)

        def step_graphed(x, y):
            loss, grad_norm = graph_step(x, y)
            steps.record(loss, y.shape[0], grad_norm)

    def loader(kind: str, workers: int):
        return make_train_loader(kind, dataset.train_images, dataset.train_labels, batch_size=case.batch_size,
                                 augment=params.data.augment, seed=cfg.seed,
                                 **{**loader_args(params, precision, rt.device), "workers": workers})

    paths = {  # name: (the step, its batches)
        "torchvision_workers_0": (step, lambda: _endless(loader("torchvision", 0))),
        f"torchvision_workers_{params.data.workers}": (step, lambda: _endless(loader("torchvision", params.data.workers))),
        "gpu_loader": (step, lambda: _endless(loader("gpu", 0))),
        "compute_ceiling": (step, lambda: iter(lambda: (x0, y0), None)),
    }
    if graphed:
        paths["gpu_loader_graphed"] = (step_graphed, paths["gpu_loader"][1])
        paths["compute_ceiling_graphed"] = (step_graphed, paths["compute_ceiling"][1])
    return CasePaths(paths, params, compile_seconds, capture_seconds, batch_kernel.enabled(x0))


def time_paths(paths: dict, device: torch.device, name: str, *, warmup_steps: int, min_steps: int,
               min_seconds: float, rounds: int, log) -> dict:
    """Each path's images/s: the median of `rounds` rounds in which the paths take turns. At small
    batches the step is bound by kernel launches, whose cost drifts by 10-20% over a minute on a
    shared host, so timing one path after the other would compare the drift rather than the paths."""
    runs: dict[str, list[dict]] = {path: [] for path in paths}
    for _ in range(rounds):
        for path, (path_step, make) in paths.items():  # a dict: with data.workers = 0 the torchvision path is timed once
            batches = make()
            runs[path].append(time_steps(path_step, batches, warmup_steps, min_steps, min_seconds, device))
            if hasattr(batches, "close"):
                batches.close()  # stops the DataLoader's workers before the next path is timed
    results = {}
    for path, measured in runs.items():
        rates = [m["images_per_second"] for m in measured]
        results[path] = {"images_per_second": statistics.median(rates), "each_round": rates,
                         "steps": sum(m["steps"] for m in measured),
                         "seconds": round(sum(m["seconds"] for m in measured), 3)}
        log(f"  {name}: {path:<24} {results[path]['images_per_second']:>10,.0f} images/s "
            f"(median of {rounds}: {', '.join(f'{r:,.0f}' for r in rates)})")
    return results


def run_case(params: config.Params, case: Case, dataset, rt: parallel.Runtime, *, warmup_steps: int,
             min_steps: int, min_seconds: float, log, rounds: int = 3) -> dict:
    """Times every path of one case; the row of the benchmark's results."""
    built = case_paths(params, case, dataset, rt)
    cfg = built.params.train
    results = time_paths(built.paths, rt.device, case.name, warmup_steps=warmup_steps, min_steps=min_steps,
                         min_seconds=min_seconds, rounds=rounds, log=log)
    row = {"batch_size": case.batch_size, "precision": case.precision, "compile": case.compile,
           "compile_mode": cfg.compile_mode if case.compile else None, "channels_last": cfg.channels_last,
           "fused_adamw": cfg.fused_adamw,
           "space_to_depth": cfg.space_to_depth, "fused_max_pool": cfg.fused_max_pool,
           "compile_seconds": round(built.compile_seconds, 3),
           "capture_seconds": None if built.capture_seconds is None else round(built.capture_seconds, 3),
           "gpu_loader_kernel": built.kernel,  # the Triton kernel, or the tensor ops (CPU, env)
           "paths": results}
    gpu = results["gpu_loader"]["images_per_second"]
    row["gpu_loader_over_torchvision_workers_0"] = round(gpu / results["torchvision_workers_0"]["images_per_second"], 2)
    row["gpu_loader_over_compute_ceiling"] = round(gpu / results["compute_ceiling"]["images_per_second"], 3)
    if "gpu_loader_graphed" in results:
        graphed_gpu = results["gpu_loader_graphed"]["images_per_second"]
        row["gpu_loader_graphed_over_eager"] = round(graphed_gpu / gpu, 3)
        row["gpu_loader_graphed_over_compute_ceiling_graphed"] = round(
            graphed_gpu / results["compute_ceiling_graphed"]["images_per_second"], 3)
    return row


def bench(params: config.Params, cases: list[Case], layout: Layout, *, warmup_steps: int = 5,
          min_steps: int = 20, min_seconds: float = 3.0, matmul_size: int = 8192, rounds: int = 3,
          log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> dict:
    check_img_size(params.model.name, params.train.img_size)
    load_start = os.getloadavg()[0]  # what else the host runs: the torchvision paths need its CPU
    dataset = load_dataset(layout.dataset)
    rt = parallel.setup("single", params.train.device)
    log(f"bench on {rt.device_name}, torch {torch.__version__}, {params.model.name} at {params.train.img_size} px")
    size = matmul_size if rt.device.type == "cuda" else min(matmul_size, 512)
    peak = bf16_peak = matmul_peak_tflops(rt.device, size)
    log(f"  bf16 matrix product ({size}^3): {peak:,.1f} TFLOP/s")
    if rt.device.type != "cuda":  # a CPU without native bf16 multiplies fp32 faster: utilisation is of the faster
        peak = max(peak, matmul_peak_tflops(rt.device, size, dtype=torch.float32))
        log(f"  fp32 matrix product ({size}^3): {peak:,.1f} TFLOP/s" if peak > bf16_peak else "  (fp32 is slower)")
    flops = flops_per_image(params.model.name, params.train.img_size, len(dataset.classes))
    rows = []
    for case in cases:
        row = run_case(params, case, dataset, rt, warmup_steps=warmup_steps, min_steps=min_steps,
                       min_seconds=min_seconds, log=log, rounds=rounds)
        for result in row["paths"].values():
            result["model_flop_utilisation"] = float(f"{result['images_per_second'] * flops / 1e12 / peak:.4g}")
        rows.append(row)
    host = {"cpu_count": os.cpu_count(), "load_average_1min_start": round(load_start, 2),
            "load_average_1min_end": round(os.getloadavg()[0], 2)}
    log(f"  host: {host_line(host)} (the bench's own work included); other work on the host slows the "
        f"torchvision paths")
    return {
        "device": rt.device_name, "torch_version": torch.__version__, "world_size": 1,
        "model": params.model.name, "img_size": params.train.img_size,
        "gflop_per_image_forward_backward": round(flops / 1e9, 3),
        "bf16_matmul_peak_tflops": float(f"{bf16_peak:.4g}"),
        # what model_flop_utilisation divides by: the bf16 peak, or on a CPU the faster of bf16 and fp32
        "matmul_peak_tflops": float(f"{peak:.4g}"), "host": host, "cases": rows,
    }


def host_line(host: dict) -> str:
    return (f"{host['cpu_count']} CPUs, 1-min load average {host['load_average_1min_start']} at the start, "
            f"{host['load_average_1min_end']} at the end")


def to_markdown(result: dict) -> str:
    lines = [f"Device: {result['device']}; torch {result['torch_version']}; {result['model']} at "
             f"{result['img_size']} px, {result['gflop_per_image_forward_backward']} GFLOP/image fwd+bwd; "
             f"bf16 matmul peak {result['bf16_matmul_peak_tflops']:,.4g} TFLOP/s"
             + (f" (MFU is of the faster fp32 peak, {result['matmul_peak_tflops']:,.4g})"
                if result.get("matmul_peak_tflops", 0) > result["bf16_matmul_peak_tflops"] else "")
             + f"; host: {host_line(result['host'])}", "",
             "| case | path | images/s | MFU |", "|---|---|---:|---:|"]
    for case in result["cases"]:
        name = Case(case["batch_size"], case["precision"], case["compile"], case["compile_mode"]).name
        name += ", space-to-depth first conv" if case.get("space_to_depth") else ""
        name += ", fused ReLU + max pool kernels" if case.get("fused_max_pool") else ""
        for path, r in case["paths"].items():
            if path == "gpu_loader":
                path += " (Triton kernel)" if case.get("gpu_loader_kernel") else " (tensor ops)"
            lines.append(f"| {name} | {path} | {r['images_per_second']:,.0f} | {100 * r['model_flop_utilisation']:.1f}% |")
        lines.append(f"| {name} | gpu loader / torchvision (0 workers) | {case['gpu_loader_over_torchvision_workers_0']:.1f}x | |")
        lines.append(f"| {name} | gpu loader / compute ceiling | {100 * case['gpu_loader_over_compute_ceiling']:.1f}% | |")
        if "gpu_loader_graphed_over_eager" in case:
            lines.append(f"| {name} | gpu loader, graphed / eager | {case['gpu_loader_graphed_over_eager']:.2f}x | |")
            lines.append(f"| {name} | gpu loader, graphed / compute ceiling, graphed | "
                         f"{100 * case['gpu_loader_graphed_over_compute_ceiling_graphed']:.1f}% | |")
    return "\n".join(lines) + "\n"


@click.command("bench")
@click.option("--case", "cases", multiple=True, default=DEFAULT_CASES, show_default=True,
              help="BATCH:PRECISION[:compile]; repeat for several cases.")
@click.option("--params", "params_path", default="params.yaml", show_default=True,
              type=click.Path(dir_okay=False), help="Model, img_size, data.workers and switches come from here.")
@click.option("--warmup-steps", default=5, show_default=True, type=click.IntRange(0), help="Untimed steps per path.")
@click.option("--min-steps", default=20, show_default=True, type=click.IntRange(1),
              help="Timed steps per path and round, at least.")
@click.option("--min-seconds", default=3.0, show_default=True, type=click.FloatRange(0),
              help="Timed seconds per path and round, at least.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1),
              help="The paths take turns this many times; each reports its median.")
@click.option("--matmul-size", default=8192, show_default=True, type=click.IntRange(16),
              help="Side of the bf16 matrix product that measures the peak (capped at 512 on a CPU).")
@click.option("--out", default="metrics/bench.json", show_default=True, type=click.Path(dir_okay=False),
              help="Where the JSON results go (a .md table is written beside it).")
def main(cases, params_path, warmup_steps, min_steps, min_seconds, rounds, matmul_size, out) -> None:
    """Measure the loaders against the compute ceiling and the device's bf16 peak."""
    parsed = [parse_case(c) for c in cases]
    result = bench(config.load(params_path), parsed, Layout(), warmup_steps=warmup_steps, min_steps=min_steps,
                   min_seconds=min_seconds, matmul_size=matmul_size, rounds=rounds)
    markdown = to_markdown(result)
    atomic.atomic_write_json(out, result, "the benchmark's results")
    atomic.atomic_write_text(str(out).removesuffix(".json") + ".md", markdown, "the benchmark's table")
    click.echo(markdown)
