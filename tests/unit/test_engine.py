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


@pytest.mark.parametrize("parallel_name, warned", [("ddp", True), ("single", False)])
def test_sync_bn_on_the_cpu_keeps_batchnorm_and_says_so_under_ddp(parallel_name, warned):
    """SyncBatchNorm needs GPUs: on the CPU a ddp run keeps BatchNorm and records why in its warnings
    (they end up in the train metrics: test_train_metrics); outside ddp sync_bn means nothing."""
    from torchvision.models import resnet18

    from fasttrain.parallel import Runtime, prepare_model

    rt = Runtime(parallel_name, CPU, world_size=2 if parallel_name == "ddp" else 1)
    model = prepare_model(resnet18(num_classes=10), rt, sync_bn=True)
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert rt.warnings == (["train.sync_bn ignored: SyncBatchNorm needs GPUs"] if warned else [])


# --- train.overlap_optimizer ----------------------------------------------------------------------

def _alexnet_steps(steps: int = 3, size: int = 64, frozen: str | None = None, **train):
    """`steps` optimizer steps of AlexNet on the CPU under a onecycle schedule (the lr changes every step,
    in both of overlap_optimizer's parameter groups); returns the Trainable and the order in which the
    late group stepped, the early group stepped and the first conv's gradient was accumulated."""
    from fasttrain import config, parallel
    from fasttrain.engine import EARLY, LATE, build_trainable, train_step
    from fasttrain.precision import PRECISIONS
    from fasttrain.train import make_scheduler

    params = config.from_dict({"model": {"name": "alexnet"}, "train": {
        "device": "cpu", "img_size": size, "batch_size": 4, "lr": 1e-3, "scheduler": "onecycle", "epochs": 1,
        **train}})
    t = build_trainable(params, PRECISIONS["fp32"], parallel.setup("single", "cpu"), num_classes=10)
    if frozen is not None:  # a parameter the backward gives no gradient
        t.raw.get_parameter(frozen).requires_grad_(False)
    scheduler = make_scheduler(params.train, t.optimizer, max(steps, 1))
    events = []
    if t.late_step is not None:
        step_group = t.optimizer.step_group
        t.optimizer.step_group = lambda i: (events.append({EARLY: "early step", LATE: "late step"}[i]), step_group(i))
        t.raw.features[0].weight.register_post_accumulate_grad_hook(lambda p: events.append("conv1 gradient"))
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(2)  # dropout's masks: the same in every run
    for _ in range(steps):
        x, y = torch.randn(4, 3, size, size, generator=g), torch.randint(0, 10, (4,), generator=g)
        train_step(t, PRECISIONS["fp32"], x.contiguous(memory_format=torch.channels_last), y)
        scheduler.step()
    return t, events


def _same_weights_and_moments(a, b) -> None:
    for (name, p), q in zip(a.raw.named_parameters(), b.raw.parameters(), strict=True):
        assert torch.equal(p, q), name
        sa, sb = a.optimizer.state.get(p, {}), b.optimizer.state.get(q, {})  # none: never stepped (frozen)
        assert sorted(sa) == sorted(sb) == ([] if not p.requires_grad else ["exp_avg", "exp_avg_sq", "step"]), name
        for k in sa:
            assert torch.equal(sa[k], sb[k]), (name, k)


def test_overlap_optimizer_steps_the_classifier_in_the_backward_to_the_same_weights_bit_for_bit():
    plain, _ = _alexnet_steps()
    overlapped, events = _alexnet_steps(overlap_optimizer=True)
    assert plain.late_step is None and len(plain.optimizer.param_groups) == 1
    early, late = overlapped.optimizer.param_groups
    assert [p for p in late["params"]] == list(overlapped.raw.classifier.parameters())
    assert len(early["params"]) + len(late["params"]) == len(list(overlapped.raw.parameters()))
    # the classifier steps once the backward is past it, before the first conv has its gradient
    assert events == ["late step", "conv1 gradient", "early step"] * 3
    assert early["lr"] == late["lr"] == plain.optimizer.param_groups[0]["lr"]  # the schedule reached both groups
    _same_weights_and_moments(plain, overlapped)


def test_a_classifier_parameter_without_a_gradient_still_steps_the_rest_after_the_backward():
    """The late group steps once all its gradients are in; a frozen one never comes, so it steps after
    the backward (AdamW skips the frozen one), before the early group, to the same weights."""
    plain, _ = _alexnet_steps(frozen="classifier.6.bias")
    overlapped, events = _alexnet_steps(frozen="classifier.6.bias", overlap_optimizer=True)
    assert events == ["conv1 gradient", "late step", "early step"] * 3
    assert not overlapped.raw.classifier[6].bias.requires_grad
    _same_weights_and_moments(plain, overlapped)


def test_a_backward_without_a_step_leaves_the_overlapped_weights_alone():
    """warm_up's forward + backward (compile, cuDNN's autotuning) must not step the classifier."""
    from fasttrain.engine import warm_up
    from fasttrain.precision import PRECISIONS

    t, _ = _alexnet_steps(steps=0, overlap_optimizer=True)
    before = [p.detach().clone() for p in t.raw.parameters()]
    warm_up(t, PRECISIONS["fp32"], [4], 64, 10, True, CPU)
    assert all(torch.equal(a, b) for a, b in zip(before, t.raw.parameters(), strict=True))
    assert t.optimizer.state == {} and all(p.grad is None for p in t.raw.parameters())


@pytest.mark.slow
def test_compiled_the_classifier_steps_before_the_features_backward_ends():
    """One compiled graph would hand every gradient over at its end, the first conv's among the
    first: no overlap. The classifier compiled apart accumulates its gradients, and steps, before
    the first conv has its gradient."""
    import torch._dynamo

    torch._dynamo.reset()
    plain, _ = _alexnet_steps(compile=True)
    torch._dynamo.reset()
    overlapped, events = _alexnet_steps(compile=True, overlap_optimizer=True)
    assert events == ["late step", "conv1 gradient", "early step"] * 3
    _same_weights_and_moments(plain, overlapped)
