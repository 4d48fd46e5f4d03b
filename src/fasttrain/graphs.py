"""The whole training step (forward, backward, GradScaler, AdamW) replayed from CUDA graphs.

At small batches an eager step is bound by the host: Python launches about a hundred kernels, each
a few microseconds of GPU work, so the GPU waits on the launcher and the step time measures the
CPU. A CUDA graph launches the recorded kernels in one call, and the step time becomes the GPU's.

One graph per batch shape (the full batch and an epoch's short last one, at each training
resolution), captured up front by `GraphedStep.capture` and sharing one memory pool. What a graph
reads each replay must live at fixed addresses: the batch is copied into the graph's own input
tensors, the learning rate is a device tensor the scheduler fills in place, and GradScaler's scale
and AdamW's step counts already live on the device (the fused AdamW takes GradScaler's found-inf
flag on the device, so amp's skipped steps need no host sync). A graph's outputs (loss, gradient
norm) are overwritten by the next replay of any graph in the pool: the caller copies them first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from fasttrain import parallel, saved
from fasttrain.engine import Trainable, random_batch, train_step
from fasttrain.precision import Precision

# Eager steps before a capture: cuDNN's autotuning, lazy state (AdamW's moments, GradScaler's scale)
# and DDP's bucket rebuild after its first iteration all happen outside the graph. DDP needs at
# least 11 of them before a whole-network capture (torch's CUDA-graph notes).
WARMUP_STEPS = 3
WARMUP_STEPS_DDP = 11


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    x: torch.Tensor  # the inputs every replay reads: the batch is copied in
    y: torch.Tensor
    loss: torch.Tensor  # the outputs every replay writes
    grad_norm: torch.Tensor | None


class GraphedStep:
    """`step(x, y)` for train_step's (loss, grad norm), from the graph captured for x's shape."""

    def __init__(self, t: Trainable, precision: Precision, rt: parallel.Runtime):
        self.t, self.precision, self.rt = t, precision, rt
        self.pool = torch.cuda.graph_pool_handle()
        # warm-up and capture share it (cuBLAS handles are per stream), and DDP was built on it
        self.stream = parallel.capture_stream(rt.device)
        self.graphs: dict[tuple, _Graph] = {}
        # "BATCHxPIXELS": the seconds of its eager warm-up steps (cuDNN's autotuning of a new shape) and of its capture
        self.seconds_each: dict[str, dict[str, float]] = {}

    def capture(self, shapes: list[tuple[int, int]], num_classes: int, channels_last: bool,
                dtype: torch.dtype) -> float:
        """Capture one graph per (batch size, image size); the model, optimizer, scaler, buffers and
        RNG are left as they were, so training is unchanged. Returns the seconds it took."""
        warmup = WARMUP_STEPS_DDP if self.rt.distributed else WARMUP_STEPS
        kept = saved.snapshot(self.t)
        torch.cuda.synchronize(self.rt.device)
        start = time.perf_counter()
        for n, size in dict.fromkeys(s for s in shapes if s[0] > 0):
            began = time.perf_counter()
            x, y = random_batch(n, size, num_classes, self.rt.device, dtype, channels_last)
            self.stream.wait_stream(torch.cuda.current_stream(self.rt.device))
            with torch.cuda.stream(self.stream):
                for _ in range(warmup):
                    train_step(self.t, self.precision, x, y)
            torch.cuda.current_stream(self.rt.device).wait_stream(self.stream)
            torch.cuda.synchronize(self.rt.device)
            warmed = time.perf_counter()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                loss, grad_norm = train_step(self.t, self.precision, x, y)
            self.graphs[tuple(x.shape)] = _Graph(graph, x, y, loss, grad_norm)
            torch.cuda.synchronize(self.rt.device)
            self.seconds_each[f"{n}x{size}"] = {"warm_up_steps": round(warmed - began, 3),
                                                 "capture": round(time.perf_counter() - warmed, 3)}
        seconds = time.perf_counter() - start
        saved.restore(self.t, kept)
        return seconds

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        g = self.graphs.get(tuple(x.shape))
        if g is None:
            raise RuntimeError(f"no CUDA graph was captured for a batch of shape {list(x.shape)}; "
                               f"captured: {[list(s) for s in self.graphs]}")
        g.x.copy_(x)
        g.y.copy_(y)
        g.graph.replay()
        return g.loss, g.grad_norm
