"""switches.decide: every pair of switches (or a switch and the runtime) that interact, and what the
run does with them: applies, falls back with its reason, or refuses with one line."""

import pytest
import torch

from fasttrain import config
from fasttrain.errors import FasttrainError
from fasttrain.parallel import Runtime
from fasttrain.switches import decide

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)
# every interacting switch off, or as the rules leave it alone: each case turns on what it is about
BASE = {"cuda_graphs": False, "cudnn_benchmark": False, "sync_bn": False, "deterministic": False,
        "fused_adamw": True, "scheduler": "plateau"}


def ddp(device, world_size=2):
    return Runtime("ddp", device, world_size=world_size)


CASES = [  # (train keys, other sections, runtime, what the plan holds, its one fallback line or None)
    # train.cuda_graphs against the device, the parallel mode, the optimizer and the schedule
    ({"cuda_graphs": True}, {}, Runtime("single", GPU), {"cuda_graphs": True}, None),
    ({"cuda_graphs": True}, {}, ddp(GPU), {"cuda_graphs": True}, None),
    ({"cuda_graphs": True}, {}, Runtime("single", CPU), {"cuda_graphs": False},
     "train.cuda_graphs: the CPU runs eagerly (CUDA graphs need a GPU)"),
    ({"cuda_graphs": True}, {}, Runtime("dp", GPU, device_ids=[0, 1]), {"cuda_graphs": False},
     "train.cuda_graphs: dp runs eagerly: nn.DataParallel copies the model to every GPU and runs the replicas "
     "from several threads each step, which one graph cannot record"),
    ({"cuda_graphs": True, "fused_adamw": False}, {}, Runtime("single", GPU), {"cuda_graphs": False},
     "train.cuda_graphs: runs eagerly with train.fused_adamw: false: the unfused AdamW under GradScaler reads "
     "its found-inf flag on the host every step"),
    ({"cuda_graphs": True, "scheduler": "onecycle", "cycle_momentum": True}, {}, ddp(GPU), {"cuda_graphs": False},
     "train.cuda_graphs: runs eagerly with train.scheduler: onecycle and train.cycle_momentum: true: it cycles "
     "AdamW's beta1 every step, a number the fused AdamW kernel takes from the host, so a graph would keep the "
     "first step's (train.cycle_momentum: false keeps beta1 at 0.9 and allows graphs)"),
    ({"cuda_graphs": True, "scheduler": "onecycle", "cycle_momentum": False}, {}, Runtime("single", GPU),
     {"cuda_graphs": True}, None),
    ({"cuda_graphs": False}, {}, Runtime("single", CPU), {"cuda_graphs": False}, None),  # not asked: not said
    # train.cudnn_benchmark against dp's replica threads and train.deterministic
    ({"cudnn_benchmark": True}, {}, Runtime("dp", GPU, device_ids=[2, 3, 5]), {"cudnn_benchmark": False},
     "train.cudnn_benchmark off: dp over 3 GPUs runs cuDNN in replica threads, and cuDNN keeps its benchmark "
     "results per thread"),
    ({"cudnn_benchmark": True}, {}, Runtime("dp", GPU, device_ids=[0]), {"cudnn_benchmark": True}, None),
    ({"cudnn_benchmark": True}, {}, Runtime("dp", CPU), {"cudnn_benchmark": True}, None),
    ({"cudnn_benchmark": True}, {}, ddp(GPU), {"cudnn_benchmark": True}, None),  # a process per GPU
    ({"cudnn_benchmark": True, "deterministic": True}, {}, Runtime("single", GPU), {"cudnn_benchmark": False},
     "train.cudnn_benchmark off: train.deterministic needs cuDNN's deterministic algorithms"),
    # train.sync_bn against the parallel mode and the device
    ({"sync_bn": True}, {}, ddp(GPU), {"sync_bn": True}, None),
    ({"sync_bn": True}, {}, ddp(CPU), {"sync_bn": False}, "train.sync_bn ignored: SyncBatchNorm needs GPUs"),
    ({"sync_bn": True}, {}, Runtime("single", GPU), {"sync_bn": False}, None),  # one process: nothing to sync
    # train.fused_adamw against the device
    ({"fused_adamw": True}, {}, Runtime("single", GPU), {"fused_adamw": True}, None),
    ({"fused_adamw": True}, {}, Runtime("single", CPU), {"fused_adamw": False}, None),
    # refused: progressive resizing against the loader and the epochs, the batch against the processes,
    # a model switch against the model
    ({"progressive_epochs": 2, "epochs": 4}, {"data": {"loader": "torchvision"}}, Runtime("single", CPU),
     "train.progressive_epochs = 2 needs data.loader: gpu", None),
    ({"progressive_epochs": 4, "epochs": 4}, {"data": {"loader": "gpu"}}, Runtime("single", CPU),
     "train.progressive_epochs = 4 leaves no epoch at train.img_size", None),
    ({"progressive_epochs": 2, "epochs": 4}, {"data": {"loader": "gpu"}}, Runtime("single", CPU), {}, None),
    ({"batch_size": 1}, {}, ddp(CPU), "train.batch_size = 1 is smaller than the 2 ddp processes", None),
    ({"batch_size": 3}, {}, ddp(CPU), "train.batch_size = 3 does not split evenly over 2 ddp processes", None),
    ({"fused_max_pool": True}, {"model": {"name": "resnet18"}}, Runtime("single", CPU),
     "train.fused_max_pool: true needs a model whose ReLU feeds a MaxPool2d", None),
    ({"fused_max_pool": True, "space_to_depth": True}, {}, Runtime("single", CPU), {}, None),  # AlexNet takes both
]


@pytest.mark.parametrize("train, sections, rt, expected, fallback", CASES,
                         ids=[f"{'+'.join(c[0])}-{c[2].parallel}-{c[2].device.type}-{i}" for i, c in enumerate(CASES)])
def test_each_interacting_pair_applies_falls_back_with_its_reason_or_is_refused(train, sections, rt, expected,
                                                                              fallback):
    params = config.from_dict({**sections, "train": {**BASE, **train}})
    if isinstance(expected, str):
        with pytest.raises(FasttrainError, match="^" + expected.replace("(", r"\(").replace(")", r"\)")):
            decide(params, rt)
        return
    plan = decide(params, rt)
    assert {k: getattr(plan, k) for k in expected} == expected
    assert plan.fallbacks == ([fallback] if fallback else [])
    assert rt.warnings == []  # said by the caller, once (train logs it and keeps it in the metrics)


def test_the_fast_recipe_runs_its_step_from_cuda_graphs_on_a_gpu():
    """The recipe's 10.5-second figure is a graphed run's: on a GPU nothing in it makes the step run
    eagerly (onecycle's beta1 cycle would: cycle_momentum is off), and the fused pools pay only graphed."""
    import yaml

    raw = yaml.safe_load(open("params.yaml"))
    for section, values in yaml.safe_load(open("recipes/fast.yaml")).items():
        raw[section].update(values)
    p = config.from_dict(raw)
    assert p.train.cuda_graphs and p.train.scheduler == "onecycle" and not p.train.cycle_momentum
    plan = decide(p, Runtime("single", GPU))
    assert plan.cuda_graphs and plan.fallbacks == []
