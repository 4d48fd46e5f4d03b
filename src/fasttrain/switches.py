"""Which of train's switches a run applies, refuses or runs without: one function, `decide`, that
every other place asks (train before it starts and as it prepares, bench, the trainable it builds).

- Refused: a combination that cannot mean what it says (progressive resizing on the torchvision
  loader, a batch that does not split over the processes, a model switch the model cannot take) is
  a one-line FasttrainError before any process starts or any file is touched.
- Fallback: a switch this runtime cannot honour (CUDA graphs on a CPU or under dp, cuDNN's benchmark
  in replica threads or under train.deterministic, SyncBatchNorm without GPUs) is off, and its
  reason goes into the log and the run's warnings (the metrics' `warnings`).
- Applies: everything else, as params.yaml says. A switch with no effect here (the fused AdamW on a
  CPU, SyncBatchNorm in one process) is off without a word: nothing is lost.

What a single key may hold (ranges, choices) is config's; this module decides how keys combine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fasttrain import config
from fasttrain.errors import FasttrainError
from fasttrain.parallel import Runtime


@dataclass(frozen=True)
class Plan:
    """What a run does with its switches: each one on or off, and why those asked for are off."""
    cuda_graphs: bool
    cudnn_benchmark: bool
    fused_adamw: bool
    sync_bn: bool
    fallbacks: list[str] = field(default_factory=list)  # one line each, for the log and the metrics


def decide(params: config.Params, rt: Runtime) -> Plan:
    """The plan for `params` on runtime `rt`; a FasttrainError for a refused combination. Refusals
    depend on the params and the world size alone, so a runtime of the world size the run will have
    (not yet set up) is enough to ask before anything starts."""
    _refuse(params, rt.world_size)
    cfg, gpu, fallbacks = params.train, rt.device.type == "cuda", []

    cudnn_benchmark = cfg.cudnn_benchmark
    if cudnn_benchmark and rt.mode.replica_threads and rt.replicas > 1:
        # cuDNN keeps its benchmark results per thread (pytorch/pytorch#191617, #191744): under torch's
        # nn.DataParallel, whose replica threads are new every step, every step searched again (dp-bf16
        # at batch 1024 on two H200s: 1,449 images/s); in fasttrain's long-lived ones it is unmeasured
        cudnn_benchmark = False
        fallbacks.append(f"train.cudnn_benchmark off: {rt.parallel} over {rt.replicas} GPUs runs cuDNN in replica "
                         "threads, and cuDNN keeps its benchmark results per thread")
    if cudnn_benchmark and cfg.deterministic:
        cudnn_benchmark = False
        fallbacks.append("train.cudnn_benchmark off: train.deterministic needs cuDNN's deterministic algorithms")

    not_graphed = _not_graphed(params, rt)
    if cfg.cuda_graphs and not_graphed:
        fallbacks.append(not_graphed)

    sync_bn = cfg.sync_bn and rt.distributed
    if sync_bn and not gpu:
        sync_bn = False
        fallbacks.append("train.sync_bn ignored: SyncBatchNorm needs GPUs")
    return Plan(cuda_graphs=cfg.cuda_graphs and not not_graphed, cudnn_benchmark=cudnn_benchmark,
                fused_adamw=cfg.fused_adamw and gpu, sync_bn=sync_bn, fallbacks=fallbacks)


def _not_graphed(params: config.Params, rt: Runtime) -> str | None:
    """Why this run cannot replay its step from CUDA graphs (None: it can)."""
    if rt.device.type != "cuda":
        return "train.cuda_graphs: the CPU runs eagerly (CUDA graphs need a GPU)"
    if rt.mode.not_capturable:
        return f"train.cuda_graphs: {rt.parallel} runs eagerly: {rt.mode.not_capturable}"
    if not params.train.fused_adamw:
        return ("train.cuda_graphs: runs eagerly with train.fused_adamw: false: the unfused AdamW under "
                "GradScaler reads its found-inf flag on the host every step")
    if params.train.scheduler == "onecycle" and params.train.cycle_momentum:
        return ("train.cuda_graphs: runs eagerly with train.scheduler: onecycle and train.cycle_momentum: true: it "
                "cycles AdamW's beta1 every step, a number the fused AdamW kernel takes from the host, so a graph "
                "would keep the first step's (train.cycle_momentum: false keeps beta1 at 0.9 and allows graphs)")
    return None


def _refuse(params: config.Params, world_size: int) -> None:
    from fasttrain.models import build_model, on_meta, with_switches

    cfg = params.train
    if cfg.progressive_epochs:
        if params.data.loader != "gpu":
            raise FasttrainError(f"train.progressive_epochs = {cfg.progressive_epochs} needs data.loader: gpu "
                                 f"(the torchvision loader resizes at one size in its workers): set it to 0 "
                                 f"or use the gpu loader")
        if cfg.progressive_epochs >= cfg.epochs:
            raise FasttrainError(f"train.progressive_epochs = {cfg.progressive_epochs} leaves no epoch at "
                                 f"train.img_size = {cfg.img_size}: use fewer than train.epochs = {cfg.epochs}")
    with on_meta():  # every model switch the model cannot take, as training would build it (free)
        with_switches(build_model(params.model.name, 10), cfg, params.model.name)
    if cfg.batch_size < world_size:
        raise FasttrainError(f"train.batch_size = {cfg.batch_size} is smaller than the {world_size} "
                             f"ddp processes: it is the global batch, so use at least {world_size}")
    if cfg.batch_size % world_size:
        raise FasttrainError(f"train.batch_size = {cfg.batch_size} does not split evenly over "
                             f"{world_size} ddp processes: use a multiple of {world_size}")
