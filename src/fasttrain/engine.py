"""The pieces every training run is made of, shared by `train` and `bench` so that the benchmark
times exactly the step that training runs."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fasttrain import config, parallel, saved
from fasttrain.models import build_model, with_switches
from fasttrain.precision import AutocastForward, Precision
from fasttrain.switches import decide


@dataclass
class Trainable:
    raw: nn.Module  # the bare torchvision model: what checkpoints hold
    net: nn.Module  # what the loop calls: autocast inside, then DataParallel/DDP, then compile
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    label_smoothing: float = 0.0
    grad_clip: float | None = None  # the largest L2 norm of all gradients together (None: no clipping)
    compiled_batch: int | None = None  # train.compile: the batch size `net` is compiled for
    eager_net: nn.Module | None = None  # train.compile: `net` uncompiled, for any other batch size

    def net_for(self, batch: int) -> nn.Module:
        """The net for a batch of this many images. Compiled, one graph per batch size would cost a
        compile each, for an epoch's short last batch as much as for the full one; so the full batch
        runs the compiled graph, and the short one, a step per epoch, the same net eagerly."""
        return self.net if self.eager_net is None or batch == self.compiled_batch else self.eager_net


def build_trainable(params: config.Params, precision: Precision, rt: parallel.Runtime, num_classes: int,
                    graphs: bool = False) -> Trainable:
    """The model, wrapped for the variant, its AdamW and GradScaler. With `graphs` (the step will be
    replayed from CUDA graphs) the optimizer is capturable and its lr a device tensor, so a
    scheduler's changes reach the recorded kernels."""
    cfg, plan = params.train, decide(params, rt)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank and in every variant
    model = with_switches(build_model(params.model.name, num_classes).to(rt.device), cfg, params.model.name)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    raw = parallel.prepare_model(model, plan.sync_bn)
    net = eager = parallel.wrap(AutocastForward(raw, precision), rt, graphs)
    if cfg.compile:
        # Static shapes, compiled in warm_up for the full batch at each training resolution; a
        # dynamic-shape graph would be slower and recompile in the middle of training.
        net = torch.compile(net, mode=cfg.compile_mode, dynamic=False)
    lr = torch.tensor(cfg.lr, device=rt.device) if graphs else cfg.lr
    optimizer = AdamW(raw.parameters(), lr=lr, betas=(0.9, cfg.adam_beta2), weight_decay=cfg.weight_decay,
                      fused=plan.fused_adamw, capturable=graphs)
    return Trainable(raw, net, optimizer, precision.scaler(rt.device.type), cfg.label_smoothing, cfg.grad_clip,
                     cfg.batch_size // rt.world_size if cfg.compile else None, eager if cfg.compile else None)


def _eager(method):
    """A torch.optim method without its torch._dynamo decorator while nothing compiles. Those
    decorators (a graph break in step; dynamo.disable around add_param_group, zero_grad, state_dict
    and load_state_dict) act only on code dynamo traces, yet their first call imports all of
    torch._dynamo: 1.8 s of every eager train process on a 2-core CPU. Compiling, the method as torch has it."""
    return method if torch.compiler.is_compiling() else getattr(method, "__wrapped__", method)


class AdamW(torch.optim.AdamW):
    """torch's AdamW, which imports no torch._dynamo in a process that does not compile (_eager)."""

    def step(self, closure=None):
        # what step's decorator does besides its graph break: gradients off unless differentiable
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _eager(torch.optim.AdamW.step)(self, closure)

    def add_param_group(self, param_group: dict) -> None:
        _eager(torch.optim.Optimizer.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _eager(torch.optim.Optimizer.zero_grad)(self, set_to_none)

    def state_dict(self) -> dict:
        return _eager(torch.optim.Optimizer.state_dict)(self)

    def load_state_dict(self, state_dict: dict) -> None:
        _eager(torch.optim.Optimizer.load_state_dict)(self, state_dict)


def train_step(t: Trainable, precision: Precision, x: torch.Tensor,
               y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step. Returns the loss and, with grad_clip, the gradients' L2 norm before
    clipping, as device tensors: nothing here waits for the GPU."""
    with precision.autocast(x.device.type):
        loss = F.cross_entropy(t.net_for(len(x))(x), y, label_smoothing=t.label_smoothing)
    t.optimizer.zero_grad(set_to_none=True)
    t.scaler.scale(loss).backward()
    grad_norm = None
    if t.grad_clip is not None:
        t.scaler.unscale_(t.optimizer)  # clip the true gradients, not the loss-scaled ones (amp)
        grad_norm = torch.nn.utils.clip_grad_norm_(t.raw.parameters(), t.grad_clip, foreach=True)
    t.scaler.step(t.optimizer)  # (after unscale_, a step with inf/NaN gradients is still skipped)
    t.scaler.update()
    return loss.detach(), grad_norm


class StepLog:
    """An epoch's per-step loss, loss scale and (grad_clip) gradient norm, kept on the device: a
    few copies per step and one host sync per epoch, instead of a dozen small kernels (or a sync)
    per step. At batch 64 a step is bound by kernel launches, so every launch saved is throughput.

    A step that GradScaler skipped (inf/NaN gradients) is one where its scale went down: the scale
    only falls by backing off, so comparing each step's scale with the one before counts the skips.
    """

    def __init__(self, steps: int, device: torch.device, scaler: torch.amp.GradScaler):
        self.losses = torch.zeros(max(1, steps), device=device)
        self.grad_norms: torch.Tensor | None = None  # from the first step that has a norm (grad_clip)
        self.scaler = scaler
        self.scales = torch.zeros(max(1, steps), device=device) if scaler.is_enabled() else None
        self.start_scale = scaler.get_scale() if scaler.is_enabled() else None  # one sync per epoch
        self.steps = 0
        self.batch_sizes: list[int] = []  # host ints: images per step
        self.lrs: list[float] | torch.Tensor = []  # the lr each step used: host floats, or a device tensor's copies

    def record(self, loss: torch.Tensor, images: int, grad_norm: torch.Tensor | None = None,
               lr: float | torch.Tensor | None = None) -> None:
        """After a step that took `images` images (and had gradients of norm `grad_norm`, and used
        learning rate `lr`: a float, or the device tensor that CUDA-graphed steps read)."""
        i = self.steps % len(self.losses)  # wraps around in the benchmark, which runs on and on
        self.losses[i:i + 1].copy_(loss)
        if isinstance(lr, torch.Tensor):
            if not isinstance(self.lrs, torch.Tensor):
                self.lrs = torch.zeros_like(self.losses)
            self.lrs[i:i + 1].copy_(lr)
        elif lr is not None and self.steps < len(self.losses):
            self.lrs.append(lr)
        if grad_norm is not None:
            if self.grad_norms is None:
                self.grad_norms = torch.zeros_like(self.losses)
            self.grad_norms[i:i + 1].copy_(grad_norm)
        if self.scales is not None:
            self.scales[i:i + 1].copy_(self.scaler._scale)  # after update(): the scale the next step uses
        if self.steps < len(self.losses):
            self.batch_sizes.append(images)
        self.steps += 1

    def state_dict(self) -> dict:
        """The steps so far, on the host: a checkpoint written mid-epoch carries them, so the resumed
        epoch's loss, skipped steps and per-step scalars are the uninterrupted run's."""
        n = self.steps

        def host(t):
            return None if t is None else t[:n].cpu()
        return {"steps": n, "losses": host(self.losses), "grad_norms": host(self.grad_norms),
                "scales": host(self.scales), "start_scale": self.start_scale, "batch_sizes": list(self.batch_sizes),
                "lrs": host(self.lrs) if isinstance(self.lrs, torch.Tensor) else list(self.lrs)}

    def load_state_dict(self, d: dict) -> None:
        n = self.steps = d["steps"]
        self.losses[:n].copy_(d["losses"])
        if d["grad_norms"] is not None:
            self.grad_norms = torch.zeros_like(self.losses)
            self.grad_norms[:n].copy_(d["grad_norms"])
        if self.scales is not None:
            self.scales[:n].copy_(d["scales"])
            self.start_scale = d["start_scale"]
        self.batch_sizes = list(d["batch_sizes"])
        if isinstance(d["lrs"], torch.Tensor):
            self.lrs = torch.zeros_like(self.losses)
            self.lrs[:n].copy_(d["lrs"])
        else:
            self.lrs = list(d["lrs"])

    def summary(self) -> dict:
        """Host values for the epoch."""
        n = self.steps
        losses = self.losses[:n].double().cpu()  # the sync
        finite = torch.isfinite(losses)
        weights = torch.tensor(self.batch_sizes, dtype=torch.float64)
        bad = (~finite).nonzero()
        skipped = 0
        scales = None
        if self.scales is not None:
            scales = self.scales[:n].cpu()
            previous = torch.cat([torch.tensor([self.start_scale]), scales[:-1]])
            skipped = int((scales < previous).sum())
        norms = None if self.grad_norms is None else self.grad_norms[:n].double().cpu()
        finite_norms = None if norms is None else norms[torch.isfinite(norms)]
        return {"loss_sum": float(torch.where(finite, losses * weights, 0.0).sum()),
                "images": int(weights.sum()), "bad_steps": int(bad.numel()),
                "first_bad_step": int(bad[0, 0]) if bad.numel() else None,
                "skipped_steps": skipped, "losses": losses.tolist(),
                "scales": None if scales is None else scales.tolist(),
                "grad_norms": None if norms is None else norms.tolist(),
                "lrs": self.lrs[:n].tolist() if isinstance(self.lrs, torch.Tensor) else list(self.lrs),
                "grad_norm_max": float(finite_norms.max()) if finite_norms is not None and finite_norms.numel() else None}


class StepWindows:
    """An epoch's steps timed in windows of equal step counts (WINDOWS per epoch; a last, shorter one
    is left out), for the interval of a run's speed when it has too few epochs for one. On a GPU the
    marks are CUDA events, the device's own clock, so timing them costs no host sync."""

    WINDOWS = 8

    def __init__(self, steps: int, device: torch.device):
        self.every = max(1, -(-steps // self.WINDOWS))  # steps per window, rounded up
        self.cuda = device.type == "cuda"
        self.marks: list = [self._mark()]
        self.images: list[int] = []  # per window, over all processes
        self._since = 0

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def record(self, images: int, done: int) -> None:
        """After this process's `done`-th step of the epoch, which took `images` images (all processes)."""
        self._since += images
        if done % self.every == 0:
            self.marks.append(self._mark())
            self.images.append(self._since)
            self._since = 0

    def images_per_second(self) -> list[float]:
        """Each whole window's rate; after the epoch's last step has finished (synchronize)."""
        pairs = zip(self.marks, self.marks[1:])
        seconds = [a.elapsed_time(b) * 1e-3 if self.cuda else b - a for a, b in pairs]
        return [n / s for n, s in zip(self.images, seconds) if s > 0]


def set_deterministic(on: bool) -> None:
    """train.deterministic: the same params give bit-identical weights on one device, run after run.

    cuDNN and cuBLAS pick deterministic algorithms (cuBLAS needs its workspace config set before
    its first handle, so this runs before any training work), and torch's deterministic mode swaps
    in deterministic kernels where it has them. Where it has none it warns instead of failing:
    AlexNet's AdaptiveAvgPool2d backward adds with atomics, but at 227 px its 6x6 input maps 1:1
    onto its 6x6 output, so each input gets one addition onto zero and the order cannot matter.
    fasttrain's own loader kernel writes each output once and adds nothing with atomics. What torch
    warned about is recorded in the run's warnings (nondeterministic_ops_recorded); cuDNN's benchmark
    is off already (switches.decide).
    """
    if not on:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True


@contextlib.contextmanager
def nondeterministic_ops_recorded(rt: parallel.Runtime):
    """Records, in the run's warnings, each op torch's deterministic mode had no deterministic
    kernel for while the block ran."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        text = str(w.message)
        if "does not have a deterministic implementation" in text:
            op = text.split(" does not")[0].strip()
            note = f"train.deterministic: torch has no deterministic kernel for {op}"
            if note not in rt.warnings:
                rt.warnings.append(note)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_batch(n: int, img_size: int, num_classes: int, device: torch.device, dtype: torch.dtype,
                 channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch shaped, typed and laid out as the gpu loader hands it to the model."""
    x = torch.rand(n, 3, img_size, img_size, device=device).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    return x, torch.randint(0, num_classes, (n,), device=device)


# torch.compile's on-disk caches, as dynamo's counters name them: AOTAutograd's (one entry per compiled
# forward-and-backward graph) and inductor's FX graph cache (its forward and backward kernels' code)
COMPILE_CACHES = {"aot_autograd": ("aot_autograd", "autograd_cache_"), "inductor": ("inductor", "fxgraph_cache_")}


def compile_cache_lookups(since: dict | None = None) -> dict:
    """This process's lookups in torch.compile's caches so far, or since `since` (an earlier result):
    per cache, the graphs found there (hit), compiled afresh (miss) and not cacheable (bypass)."""
    from torch._dynamo.utils import counters

    now = {name: {k: counters[group][prefix + k] for k in ("hit", "miss", "bypass")}
           for name, (group, prefix) in COMPILE_CACHES.items()}
    if since:
        now = {name: {k: n - since[name][k] for k, n in c.items()} for name, c in now.items()}
    return now


def warm_up(t: Trainable, precision: Precision, batch_sizes: list[int], img_size: int, num_classes: int,
            channels_last: bool, device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    """Forward + backward once per batch shape without an optimizer step, so torch.compile and cuDNN
    autotuning happen outside the timed region; buffers (BatchNorm statistics), gradients and RNG
    are restored, so training is unchanged. Returns the seconds it took."""
    kept = saved.snapshot(t, weights=False)  # no optimizer step here: the weights stay as they are
    synchronize(device)
    start = time.perf_counter()
    for n in dict.fromkeys(b for b in batch_sizes if b > 0):
        x, y = random_batch(n, img_size, num_classes, device, dtype, channels_last)  # the loader's: one graph
        with precision.autocast(device.type):
            loss = F.cross_entropy(t.net_for(n)(x), y)
        t.scaler.scale(loss).backward()
    synchronize(device)
    seconds = time.perf_counter() - start
    t.optimizer.zero_grad(set_to_none=True)
    saved.restore(t, kept)
    return seconds
