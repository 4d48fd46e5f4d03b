"""StepLog: the epoch's per-step bookkeeping that replaces a dozen small kernels per step; and the optimizer."""

import copy
import math

import pytest
import torch

from fasttrain.engine import StepLog

CPU = torch.device("cpu")


class FakeScaler:
    """GradScaler's surface that StepLog reads: enabled, the scale now, the scale tensor."""

    def __init__(self, scale: float | None):
        self.enabled = scale is not None
        self._scale = None if scale is None else torch.tensor([scale])

    def is_enabled(self):
        return self.enabled

    def get_scale(self):
        return float(self._scale)


def test_weighted_loss_sum_and_images():
    log = StepLog(3, CPU, FakeScaler(None))
    for loss, images in ((2.0, 8), (1.0, 8), (4.0, 3)):
        log.record(torch.tensor(loss), images)
    s = log.summary()
    assert s["loss_sum"] == 2 * 8 + 1 * 8 + 4 * 3 and s["images"] == 19
    assert s["bad_steps"] == 0 and s["first_bad_step"] is None and s["skipped_steps"] == 0
    assert s["losses"] == [2.0, 1.0, 4.0] and s["scales"] is None


def test_non_finite_losses_are_counted_left_out_of_the_sum_and_the_first_is_named():
    log = StepLog(5, CPU, FakeScaler(None))
    for loss in (1.0, math.inf, 2.0, math.nan, 3.0):
        log.record(torch.tensor(loss), 2)
    s = log.summary()
    assert s["bad_steps"] == 2 and s["first_bad_step"] == 1
    assert s["loss_sum"] == (1.0 + 2.0 + 3.0) * 2


def test_skipped_steps_are_the_steps_whose_scale_fell():
    scaler = FakeScaler(1024.0)
    log = StepLog(5, CPU, scaler)
    # after each step: skipped (halved), kept, grown (doubled), skipped, kept
    for scale in (512.0, 512.0, 1024.0, 512.0, 512.0):
        scaler._scale = torch.tensor([scale])
        log.record(torch.tensor(1.0), 1)
    s = log.summary()
    assert s["skipped_steps"] == 2
    assert s["scales"] == [512.0, 512.0, 1024.0, 512.0, 512.0]


def test_a_short_epoch_reads_only_the_steps_it_ran():
    log = StepLog(10, CPU, FakeScaler(None))
    log.record(torch.tensor(5.0), 4)
    s = log.summary()
    assert s["losses"] == [5.0] and s["images"] == 4


@pytest.mark.parametrize("steps", [0, 1])
def test_record_wraps_around_when_steps_exceed_the_buffer(steps):
    log = StepLog(steps, CPU, FakeScaler(None))
    for loss in range(4):
        log.record(torch.tensor(float(loss)), 1)
    assert log.losses.tolist() == [3.0]


@pytest.mark.parametrize("beta2", [0.999, 0.99])
def test_the_optimizer_is_adamw_with_the_params_betas_and_weight_decay(beta2):
    from fasttrain import config, parallel
    from fasttrain.engine import build_trainable
    from fasttrain.precision import PRECISIONS

    params = config.from_dict({"model": {"name": "resnet18"},
                               "train": {"adam_beta2": beta2, "weight_decay": 0.05, "lr": 3e-4, "device": "cpu"}})
    t = build_trainable(params, PRECISIONS["fp32"], parallel.setup("single", "cpu"), num_classes=10)
    assert isinstance(t.optimizer, torch.optim.AdamW)
    group = t.optimizer.param_groups[0]
    assert (group["betas"], group["weight_decay"], group["lr"]) == ((0.9, beta2), 0.05, 3e-4)


def test_the_optimizer_without_dynamos_decorators_steps_saves_and_loads_as_torchs_adamw():
    """engine.AdamW calls torch's methods less their torch._dynamo decorators (which only act on traced
    code): the same weights and state bit for bit, gradients off inside the step, the same state_dict."""
    from fasttrain.engine import AdamW

    def steps(cls, torch_state=None):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
        opt = cls(model.parameters(), lr=1e-2, weight_decay=0.1)
        if torch_state is not None:
            opt.load_state_dict(torch_state)
        grad_inside = []
        opt.register_step_pre_hook(lambda o, args, kwargs: grad_inside.append(torch.is_grad_enabled()))
        for i in range(3):
            opt.zero_grad()
            model(torch.randn(4, 6, generator=torch.Generator().manual_seed(i))).square().sum().backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()], opt.state_dict(), grad_inside

    ours, theirs = steps(AdamW), steps(torch.optim.AdamW)
    assert all(torch.equal(a, b) for a, b in zip(ours[0], theirs[0]))
    assert ours[2] == theirs[2] == [True] * 3  # (the hook runs before the step turns gradients off)
    assert ours[1]["param_groups"] == theirs[1]["param_groups"]
    assert all(torch.equal(ours[1]["state"][k]["exp_avg_sq"], theirs[1]["state"][k]["exp_avg_sq"]) for k in ours[1]["state"])
    # each loads torch's own state (a copy: a loaded state's tensors are stepped in place)
    resumed, resumed_torch = (steps(cls, copy.deepcopy(theirs[1])) for cls in (AdamW, torch.optim.AdamW))
    assert all(torch.equal(a, b) for a, b in zip(resumed[0], resumed_torch[0]))


def test_grad_clip_returns_the_norm_before_clipping_and_clips_to_it():
    from fasttrain import config, parallel
    from fasttrain.engine import build_trainable, train_step
    from fasttrain.precision import PRECISIONS

    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    norms = {}
    for clip in (None, 1e-3):
        params = config.from_dict({"model": {"name": "resnet18"}, "train": {"grad_clip": clip, "device": "cpu"}})
        t = build_trainable(params, PRECISIONS["fp32"], parallel.setup("single", "cpu"), num_classes=10)
        t.optimizer.step = lambda: None  # keep the weights: the step's gradients are what is checked
        loss, norm = train_step(t, PRECISIONS["fp32"], x, y)
        after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in t.raw.parameters()]))
        norms[clip] = (float(loss), None if norm is None else float(norm), float(after))
    loss, none, unclipped = norms[None]
    assert none is None
    assert norms[1e-3][0] == pytest.approx(loss)  # the same initial weights and batch
    assert norms[1e-3][1] == pytest.approx(unclipped, rel=1e-4) and unclipped > 1e-2  # the norm before clipping
    assert norms[1e-3][2] == pytest.approx(1e-3, rel=1e-3)  # and the gradients clipped to the limit


def test_grad_norms_are_kept_per_step_and_their_finite_maximum_reported():
    log = StepLog(4, CPU, FakeScaler(None))
    for norm in (1.5, float("inf"), 4.0):
        log.record(torch.tensor(1.0), 2, torch.tensor(norm))
    summary = log.summary()
    assert summary["grad_norms"] == [1.5, float("inf"), 4.0] and summary["grad_norm_max"] == 4.0
    assert StepLog(4, CPU, FakeScaler(None)).summary()["grad_norm_max"] is None


def _trainable(**train):
    from fasttrain import config, parallel
    from fasttrain.engine import build_trainable
    from fasttrain.precision import PRECISIONS

    params = config.from_dict({"model": {"name": "resnet18"}, "train": {"device": "cpu", **train}})
    return build_trainable(params, PRECISIONS["fp32"], parallel.setup("single", "cpu"), num_classes=10)


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_label_smoothing_mixes_the_true_class_loss_with_the_mean_loss_over_all_classes(smoothing):
    """train.label_smoothing = e: loss = (1 - e) * -log p[y] + e * mean over classes k of -log p[k]."""
    from fasttrain.engine import train_step
    from fasttrain.precision import PRECISIONS

    t = _trainable(label_smoothing=smoothing)
    with torch.no_grad():
        t.raw.fc.weight.mul_(50)  # confident logits, far from uniform: smoothing changes the loss a lot
    t.optimizer.step = lambda: None
    x, y = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 3, 3, 9])
    with torch.no_grad():
        log_p = t.net(x).log_softmax(dim=1)  # training mode, as train_step's forward: the same batch statistics
    true_class = -log_p[torch.arange(4), y].mean()
    every_class = -log_p.mean(dim=1).mean()
    assert abs(float(every_class - true_class)) > 1  # the two terms differ, so a wrong mix shows
    loss, _ = train_step(t, PRECISIONS["fp32"], x, y)
    assert float(loss) == pytest.approx(float((1 - smoothing) * true_class + smoothing * every_class), rel=1e-5)


@pytest.mark.parametrize("fused", [True, False])
def test_fused_adamw_is_never_asked_of_the_cpu(fused):
    """train.fused_adamw picks the fused kernel on CUDA only (test_fused_adamw_on_the_gpu)."""
    assert not _trainable(fused_adamw=fused).optimizer.param_groups[0]["fused"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fused", [True, False])
def test_fused_adamw_on_the_gpu(fused):
    from fasttrain import config, parallel
    from fasttrain.engine import build_trainable
    from fasttrain.precision import PRECISIONS

    params = config.from_dict({"model": {"name": "resnet18"}, "train": {"device": "cuda", "fused_adamw": fused}})
    t = build_trainable(params, PRECISIONS["fp32"], parallel.setup("single", "cuda"), num_classes=10)
    assert bool(t.optimizer.param_groups[0]["fused"]) is fused


def test_step_windows_time_equal_runs_of_steps_and_leave_the_short_last_one_out(monkeypatch):
    from fasttrain import engine
    clock = iter(0.5 * i for i in range(100))  # each mark half a second after the one before
    monkeypatch.setattr(engine.time, "perf_counter", lambda: next(clock))
    windows = engine.StepWindows(20, torch.device("cpu"))  # 8 windows a 20-step epoch: 3 steps each
    for done in range(1, 21):
        windows.record(32, done)  # 16 images in each of two processes
    # marks after steps 3, 6, ..., 18: six whole windows of 96 images in 0.5 s; steps 19 and 20 left out
    assert windows.images_per_second() == [192.0] * 6
