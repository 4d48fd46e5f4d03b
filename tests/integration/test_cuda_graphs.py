"""train.cuda_graphs and train.deterministic: where graphs run, where they fall back and say so, and
that a graphed step computes what the eager step computes (GPU-marked tests, on a CUDA machine)."""

import csv

import pytest
import torch

from fasttrain import config, graphs, parallel
from fasttrain.engine import StepLog, build_trainable, set_deterministic, train_step
from fasttrain.precision import PRECISIONS
from scratch import record, run, set_params



# --- where graphs cannot run: the reason, in one line -------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_a_cpu_run_goes_eager_and_records_why_only_when_graphs_were_asked_for(tiny_repo, cuda_graphs):
    set_params(tiny_repo, {"train": {"cuda_graphs": cuda_graphs, "device": "cpu"}})
    run(["fasttrain", "download"], tiny_repo)
    proc = run(["fasttrain", "train", "--parallel", "single", "--precision", "fp32"], tiny_repo)
    metrics = record(tiny_repo, "single-fp32")
    reason = "train.cuda_graphs: the CPU runs eagerly (CUDA graphs need a GPU)"
    assert metrics["cuda_graphs"] is False
    assert metrics["capture_seconds"] is None and metrics["capture_seconds_each"] is None
    assert (reason in metrics["warnings"]) is cuda_graphs
    assert (reason in proc.stderr.splitlines()) is cuda_graphs


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_ddp_is_built_on_the_stream_its_steps_run_on(tiny_repo, cuda_graphs):
    """DDP keeps each parameter's gradient accumulator, which remembers the stream it was made on; a
    backward that reaches it from another stream syncs the two and torch warns ("The AccumulateGrad
    node's stream does not match ..."). Graphed, DDP is built on the capture stream; eager, on the
    stream the steps run on."""
    set_params(tiny_repo, {"train": {"cuda_graphs": cuda_graphs, "device": "cuda", "nproc": 1}})
    run(["fasttrain", "download"], tiny_repo)
    proc = run(["fasttrain", "train", "--parallel", "ddp", "--precision", "bf16"], tiny_repo)
    metrics = record(tiny_repo, "ddp-bf16")
    assert metrics["cuda_graphs"] is cuda_graphs and metrics["world_size"] == 1
    assert "AccumulateGrad" not in proc.stderr, proc.stderr[-2000:]


# --- train.deterministic ----------------------------------------------------------------------

@pytest.mark.slow
def test_a_deterministic_run_repeats_bit_for_bit(tiny_repo, tmp_path):
    from fasttrain import checkpoint

    set_params(tiny_repo, {"train": {"deterministic": True, "epochs": 2, "device": "cpu"},
                           "data": {"augment": True}})
    run(["fasttrain", "download"], tiny_repo)
    weights = []
    for _ in range(2):
        run(["fasttrain", "train", "--parallel", "single", "--precision", "fp32"], tiny_repo)
        weights.append(checkpoint.load(tiny_repo / "models" / "seed0" / "single-fp32.pt")["model"])
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    metrics = record(tiny_repo, "single-fp32")
    assert metrics["deterministic"] is True


def test_deterministic_mode_sets_torch_cudnn_and_cublas(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        set_deterministic(True)  # (cuDNN's benchmark is off by then: switches.decide, test_switches)
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        import os
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]


# --- on a GPU: a graphed step is the eager step -----------------------------------------------

def _trainable(precision: str, graphed: bool, **train):
    params = config.from_dict({"model": {"name": "alexnet"},
                               "train": {"device": "cuda", "lr": 1e-4, "cuda_graphs": True, **train}})
    rt = parallel.setup("single", "cuda")
    return build_trainable(params, PRECISIONS[precision], rt, num_classes=10, graphs=graphed), rt


def _batches(n, size, count, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for _ in range(count):
        x = torch.rand(n, 3, size, size, device="cuda", generator=g).contiguous(memory_format=torch.channels_last)
        out.append((x, torch.randint(0, 10, (n,), device="cuda", generator=g)))
    return out


def _halve_lr_at(i: int, t, when: int = 4) -> None:
    """A scheduler's change between steps: halves the lr before step `when`."""
    if i == when:
        halved = set()  # a tensor lr may be one tensor shared by several groups
        for group in t.optimizer.param_groups:
            if not isinstance(group["lr"], torch.Tensor):
                group["lr"] /= 2
            elif id(group["lr"]) not in halved:
                halved.add(id(group["lr"]))
                group["lr"].fill_(group["lr"].item() / 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_graphed_and_eager_steps_give_the_same_losses_and_weights(precision):
    # every shape the loop meets: two resolutions, and a short last batch at each
    batches = _batches(16, 64, 3) + _batches(5, 64, 1, 1) + _batches(16, 96, 2, 2) + _batches(5, 96, 1, 3)
    torch.manual_seed(1)  # the dropout masks: the same stream in both runs
    eager, _ = _trainable(precision, graphed=False)
    eager_losses = []
    for i, (x, y) in enumerate(batches):
        _halve_lr_at(i, eager)
        eager_losses.append(float(train_step(eager, PRECISIONS[precision], x, y)[0]))

    torch.manual_seed(1)
    t, rt = _trainable(precision, graphed=True)
    step = graphs.GraphedStep(t, PRECISIONS[precision], rt)
    step.capture([(16, 64), (5, 64), (16, 96), (5, 96)], 10, True, torch.float32)
    assert len(step.graphs) == 4
    graphed_losses = []
    for i, (x, y) in enumerate(batches):
        _halve_lr_at(i, t)  # in place, as torch's schedulers change a tensor lr: the graphs read it
        graphed_losses.append(float(step(x, y)[0]))
    assert float(t.optimizer.param_groups[0]["lr"]) == pytest.approx(eager.optimizer.param_groups[0]["lr"], rel=1e-6)
    assert eager.optimizer.param_groups[0]["lr"] == 5e-5

    tol = {"fp32": 1e-4, "bf16": 2e-2}.get(precision, 5e-3)  # fp16/bf16 rounding, accumulated over 8 steps
    assert graphed_losses == pytest.approx(eager_losses, rel=tol)
    for (name, a), b in zip(eager.raw.named_parameters(), t.raw.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=tol, atol=tol * 1e-2), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphed_amp_skips_a_step_with_a_non_finite_gradient_and_counts_it():
    t, rt = _trainable("amp", graphed=True)
    step = graphs.GraphedStep(t, PRECISIONS["amp"], rt)
    step.capture([(16, 64)], 10, True, torch.float32)
    log = StepLog(3, rt.device, t.scaler)
    (good1, y1), (bad, y2), (good2, y3) = _batches(16, 64, 3)
    bad = bad.clone()
    bad[0, 0, 0, 0] = float("inf")  # an inf in the input: inf/NaN activations, loss and gradients
    scale = t.scaler.get_scale()
    log.record(*step(good1, y1)[:1], 16)
    before = [p.detach().clone() for p in t.raw.parameters()]
    log.record(*step(bad, y2)[:1], 16)
    assert all(torch.equal(a, b) for a, b in zip(before, t.raw.parameters(), strict=True))  # skipped: unchanged
    log.record(*step(good2, y3)[:1], 16)
    assert not all(torch.equal(a, b) for a, b in zip(before, t.raw.parameters(), strict=True))
    summary = log.summary()
    assert summary["skipped_steps"] == 1 and summary["bad_steps"] == 1 and summary["first_bad_step"] == 1
    assert summary["scales"] == [scale, scale / 2, scale / 2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "amp", "bf16"])
def test_a_graphed_run_with_two_resolutions_and_a_short_batch_trains_as_the_eager_run(tiny_repo, precision):
    """The whole loop on a GPU: progressive resizing's two shapes, a short last batch (100 = 3 x 32 + 4),
    the classic recipe's plateau schedule (a lr change between steps is the step test's). Both resolutions (224 and
    227 px) give AlexNet a 6x6 map before its adaptive pooling, whose backward then adds each value
    once: in deterministic mode no kernel of the step adds in a varying order, so the two runs may
    differ only by what graphs change, and a half-precision run does not amplify atomics' rounding
    into different weights."""
    from fasttrain import checkpoint

    set_params(tiny_repo, {"data": {"synthetic_train_size": 100, "augment": True},
                           "model": {"name": "alexnet"},
                           "train": {"device": "cuda", "epochs": 3, "img_size": 227, "progressive_epochs": 1,
                                     "progressive_size": 224, "scheduler": "plateau", "deterministic": True}})
    run(["fasttrain", "download"], tiny_repo)
    weights, metrics, losses, lrs = {}, {}, {}, {}
    for cuda_graphs in (False, True):
        set_params(tiny_repo, {"train": {"cuda_graphs": cuda_graphs}})
        run(["fasttrain", "train", "--parallel", "single", "--precision", precision], tiny_repo)
        weights[cuda_graphs] = checkpoint.load(tiny_repo / "models" / "seed0" / f"single-{precision}.pt")["model"]
        metrics[cuda_graphs] = record(tiny_repo, f"single-{precision}")
        with open(tiny_repo / "plots" / "train" / "seed0" / f"single-{precision}.csv") as f:
            rows = list(csv.DictReader(f))
        losses[cuda_graphs] = [float(row["train_loss"]) for row in rows]
        lrs[cuda_graphs] = [row["lr"] for row in rows]
    assert metrics[True]["cuda_graphs"] is True and metrics[True]["capture_seconds"] > 0
    each = metrics[True]["capture_seconds_each"]  # both resolutions, the full batch of 32 and the short one of 4
    assert sorted(each) == ["32x224", "32x227", "4x224", "4x227"], each
    assert all(s["warm_up_steps"] > 0 and s["capture"] > 0 for s in each.values()), each
    assert sum(s["warm_up_steps"] + s["capture"] for s in each.values()) <= metrics[True]["capture_seconds"] + 0.01
    assert metrics[False]["capture_seconds_each"] is None
    assert metrics[False]["cuda_graphs"] is False
    assert len(losses[True]) == 3 and losses[True] == pytest.approx(losses[False], rel=1e-3), losses
    assert lrs[True] == lrs[False], (lrs, losses)
    for k in weights[False]:
        a, b = weights[False][k].float(), weights[True][k].float()
        assert torch.allclose(a, b, rtol=1e-2, atol=1e-4), f"{k}: largest difference {(a - b).abs().max():.3g}"
