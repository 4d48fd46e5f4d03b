"""On a GPU: which switches make the step fastest? Times the gpu loader and the compute ceiling
(bench's own paths) over switch combinations, and where the step's time goes (profiler: kernel
time per step against wall time per step; kernels << wall means the step is bound by kernel
launches). Reads the prepared data set of the current folder (data/dataset.pt: `fasttrain download`).

Usage: python3 scripts/gpu/sweep.py PARAMS OUT.json CASE... where CASE is
BATCH:PRECISION:key=value,key=value: keys of train: (e.g. channels_last=true,compile=true), plus
  cudnn_limit=N        torch.backends.cudnn.benchmark_limit (cuDNN algorithms tried; 0: all; torch's default 10)
  inductor.NAME=VALUE  a torch._inductor.config setting (e.g. inductor.max_autotune_conv_backends=ATEN)
Compiled cases are profiled too (after their warm-up compile); PROFILE_TOP (environment) sets how many
kernels are listed.
"""

import contextlib
import dataclasses
import json
import os
import sys
import time

import torch
import yaml

from fasttrain import config, parallel
from fasttrain.bench import Case, case_paths, time_paths
from fasttrain.data import load_dataset
from fasttrain.engine import (StepLog, build_trainable, random_batch, synchronize,
                              train_step)
from fasttrain.layout import Layout
from fasttrain.loaders import input_dtype
from fasttrain.precision import PRECISIONS


def kernel_ms_per_step(params, precision, rt, classes, batch, steps=30):
    t = build_trainable(params, precision, rt, classes)
    log = StepLog(1024, rt.device, t.scaler)
    x, y = random_batch(batch, params.train.img_size, classes, rt.device, input_dtype(params, precision),
                        params.train.channels_last)  # as bench's compute ceiling

    def step():  # as the training loop
        loss, grad_norm = train_step(t, precision, x, y)
        log.record(loss, batch, grad_norm)

    for _ in range(10):
        step()
    synchronize(rt.device)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(rt.device)
        wall = (time.perf_counter() - start) / steps * 1e3
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA  # not the CPU ranges,
               and not getattr(e, "is_user_annotation", False)]  # nor ranges on the GPU's timeline (Optimizer.step)
    kernel = sum(e.self_device_time_total for e in kernels) / steps / 1e3
    launches = sum(e.count for e in events if e.key.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch"))) / steps
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:int(os.environ.get("PROFILE_TOP", "8"))]
    return {"wall_ms_per_step_profiled": round(wall, 3), "kernel_ms_per_step": round(kernel, 3),
            "launches_per_step": launches,
            "top": [(e.key[:90], round(e.self_device_time_total / steps / 1e3, 3), e.count // steps) for e in top]}


@contextlib.contextmanager
def knobs(settings: dict):
    """cudnn_limit and inductor.* settings for one case, restored afterwards."""
    import torch._inductor.config as inductor
    saved_limit = torch.backends.cudnn.benchmark_limit
    saved = {k: getattr(inductor, k.removeprefix("inductor.")) for k in settings if k.startswith("inductor.")}
    try:
        for k, v in settings.items():
            if k == "cudnn_limit":
                torch.backends.cudnn.benchmark_limit = int(v)
            else:
                setattr(inductor, k.removeprefix("inductor."), v)
        yield
    finally:
        torch.backends.cudnn.benchmark_limit = saved_limit
        for k, v in saved.items():
            setattr(inductor, k.removeprefix("inductor."), v)


PATHS = ("gpu_loader", "compute_ceiling", "gpu_loader_graphed", "compute_ceiling_graphed")  # graphed: where graphs run


def main(params_path, out, *cases):
    base = config.load(params_path)
    dataset = load_dataset(Layout().dataset)
    rt = parallel.setup("single", "auto")
    rows = []
    for text in cases:
        batch, precision_name, *rest = text.split(":")
        overrides = dict(kv.split("=", 1) for kv in rest[0].split(",")) if rest and rest[0] else {}
        special = {k: yaml.safe_load(overrides.pop(k)) for k in list(overrides)  # values parsed as the train keys'
                   if k == "cudnn_limit" or k.startswith("inductor.")}
        train = dataclasses.replace(base.train, **{k: yaml.safe_load(v) for k, v in overrides.items()})
        params = dataclasses.replace(base, train=train)
        case = Case(int(batch), precision_name, train.compile)
        row = {"case": text}
        try:
            with knobs(special):
                built = case_paths(params, case, dataset, rt)
                chosen = {name: path for name, path in built.paths.items() if name in PATHS}
                row["paths"] = p = time_paths(chosen, rt.device, case.name, warmup_steps=10, min_steps=30,
                                              min_seconds=2.0, rounds=3, log=lambda m: None)
                row["compile_seconds"] = round(built.compile_seconds, 3)
                row["gpu_over_ceiling"] = round(p["gpu_loader"]["images_per_second"] / p["compute_ceiling"]["images_per_second"], 3)
                row["profile"] = kernel_ms_per_step(dataclasses.replace(params, train=dataclasses.replace(train, batch_size=int(batch))),
                                                    PRECISIONS[precision_name], rt, len(dataset.classes), int(batch))
        except Exception as e:  # one failing combination must not lose the others
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        rows.append(row)
        p = row.get("paths", {})
        print(f"{text:<70} gpu {p.get('gpu_loader', {}).get('images_per_second', 0):>9,.0f}  "
              f"ceiling {p.get('compute_ceiling', {}).get('images_per_second', 0):>9,.0f}  "
              f"ratio {row.get('gpu_over_ceiling', 0):.3f}  "
              f"graphed gpu {p.get('gpu_loader_graphed', {}).get('images_per_second', 0):>9,.0f}  "
              f"ceiling {p.get('compute_ceiling_graphed', {}).get('images_per_second', 0):>9,.0f}  compile {row.get('compile_seconds', 0):.1f}s  "
              f"{row.get('profile', {}).get('kernel_ms_per_step', '')} / {row.get('profile', {}).get('wall_ms_per_step_profiled', '')} ms "
              f"{row.get('error', '')}", flush=True)
        for name, ms, per_step in row.get("profile", {}).get("top", []):
            print(f"    {ms:8.3f} ms/step  x{per_step:<3} {name}", flush=True)
        json.dump(rows, open(out, "w"), indent=1)
        torch._dynamo.reset()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(*sys.argv[1:])
