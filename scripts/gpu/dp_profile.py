"""On a host with 2+ GPUs: where a dp step's time goes, against one GPU at the same global batch.

Times the training step (fasttrain's own: autocast inside the replicas, fused AdamW, GradScaler) on
one fixed batch for `single`, for `dp` over N GPUs (fasttrain's DataParallel: one long-lived thread
per replica) and for `dp-torch` (torch's nn.DataParallel: new threads every step), then profiles
each: wall time per step, the host time of nn.DataParallel's parts (scatter, replicate,
parallel_apply, gather; named ranges around its methods), and kernel time per GPU. Kernel time far
below wall time on every GPU means the GPUs wait on the host.

Usage: python3 scripts/gpu/dp_profile.py PARAMS OUT.json PRECISION:BATCH... [--gpus N]
  e.g. python3 scripts/gpu/dp_profile.py params.yaml dp.json amp:128 bf16:128 fp32:128
"""

import collections
import json
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from fasttrain import config, parallel, switches
from fasttrain.engine import build_trainable, random_batch, synchronize, train_step
from fasttrain.loaders import input_dtype
from fasttrain.precision import PRECISIONS

DP_PARTS = ("scatter", "replicate", "parallel_apply", "gather")


def named_dp_parts(net: torch.nn.Module) -> None:
    """Wraps nn.DataParallel's parts in profiler ranges `dp.<part>` (its forward calls them as methods)."""
    dp = next((m for m in net.modules() if isinstance(m, torch.nn.DataParallel)), None)
    if dp is None:
        return
    for name in DP_PARTS:
        method = getattr(dp, name)

        def ranged(*args, _method=method, _name=name, **kwargs):
            with record_function(f"dp.{_name}"):
                return _method(*args, **kwargs)

        setattr(dp, name, ranged)


def measure(params: config.Params, parallel_name: str, precision_name: str, batch: int, gpus: int,
            steps: int = 30) -> dict:
    precision = PRECISIONS[precision_name]
    dp = parallel_name.startswith("dp")
    rt = parallel.setup("dp" if dp else parallel_name, "cuda", nproc=gpus if dp else None)
    torch.backends.cudnn.benchmark = switches.decide(params, rt).cudnn_benchmark
    t = build_trainable(params, precision, rt, num_classes=10)
    if parallel_name == "dp-torch":  # torch's own nn.DataParallel: new replica threads every step
        t.net = torch.nn.DataParallel(t.net.module, device_ids=t.net.device_ids)
    named_dp_parts(t.net)
    x, y = random_batch(batch, params.train.img_size, 10, rt.device, input_dtype(params, precision),
                        params.train.channels_last)
    for _ in range(10):  # warm-up: cuDNN, AdamW's state, the scaler
        train_step(t, precision, x, y)
    synchronize(rt.device)

    def ms_per_step() -> float:  # until every GPU is done
        start = time.perf_counter()
        for _ in range(steps):
            train_step(t, precision, x, y)
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)
        return (time.perf_counter() - start) / steps * 1e3

    unprofiled = ms_per_step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        profiled = ms_per_step()
    kernel_ms = collections.Counter()
    launches = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
            kernel_ms[f"cuda:{e.device_index}"] += e.device_time_total / 1e3 / steps
            launches[f"cuda:{e.device_index}"] += 1 / steps
    parts = {e.key: round(e.cpu_time_total / 1e3 / steps, 3) for e in prof.key_averages()
             if e.key.startswith("dp.") and e.device_type == torch.autograd.DeviceType.CPU}
    top_cpu = sorted((e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CPU),
                     key=lambda e: -e.self_cpu_time_total)[:12]
    return {
        "parallel": parallel_name, "precision": precision_name, "global_batch": batch,
        "gpus": len(rt.device_ids) if rt.device_ids else 1,
        "ms_per_step": round(unprofiled, 3), "images_per_second": round(batch / unprofiled * 1e3, 1),
        "ms_per_step_profiled": round(profiled, 3),
        "kernel_ms_per_step_by_gpu": {k: round(v, 3) for k, v in sorted(kernel_ms.items())},
        "kernels_per_step_by_gpu": {k: round(v, 1) for k, v in sorted(launches.items())},
        "dp_parts_host_ms_per_step": parts,
        "top_host_ops_self_ms_per_step": [(e.key[:80], round(e.self_cpu_time_total / 1e3 / steps, 3), e.count // steps)
                                          for e in top_cpu],
    }


def main(argv: list[str]) -> None:
    gpus = torch.cuda.device_count()
    if "--gpus" in argv:
        i = argv.index("--gpus")
        gpus = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if len(argv) < 3 or gpus < 2:
        sys.exit(__doc__ if len(argv) < 3 else f"dp_profile needs 2+ GPUs; {gpus} visible")
    params_path, out, *cases = argv
    params = config.load(params_path)
    rows = []
    for case in cases:
        precision_name, batch = case.split(":")
        for parallel_name in ("single", "dp", "dp-torch"):
            row = measure(params, parallel_name, precision_name, int(batch), gpus)
            rows.append(row)
            print(f"{parallel_name:>6} {precision_name:>8} batch {batch:>4} on {row['gpus']} GPU(s): "
                  f"{row['ms_per_step']:7.2f} ms/step {row['images_per_second']:>9,.0f} img/s; kernels per GPU "
                  f"{row['kernel_ms_per_step_by_gpu']} ms; dp parts {row['dp_parts_host_ms_per_step']}", flush=True)
            for key, ms, count in row["top_host_ops_self_ms_per_step"][:6]:
                print(f"        host {ms:7.3f} ms/step x{count:<4} {key}", flush=True)
            json.dump(rows, open(out, "w"), indent=1)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
