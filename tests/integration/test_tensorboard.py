"""A real tiny `fasttrain train`, its TensorBoard logs read back with TensorBoard's own reader."""

import csv
import shutil

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.plugins.hparams import plugin_data_pb2

from scratch import run, set_params

pytestmark = pytest.mark.slow

EPOCHS, STEPS_PER_EPOCH = 2, 2  # 64 images in batches of 32: fp16 steps take seconds on a CPU


def hparams_of(mux: EventMultiplexer, run_name: str) -> dict:
    content = mux.PluginRunToTagToContent("hparams")[run_name]["_hparams_/session_start_info"]
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {k: v.string_value or v.number_value or v.bool_value for k, v in info.hparams.items()}


def test_tensorboard_has_steps_epochs_and_hparams_of_each_variant_in_its_own_run(tiny_repo):
    set_params(tiny_repo, {"data": {"synthetic_train_size": 64}, "train": {"epochs": EPOCHS}, "run": {"log_every_steps": 1}})
    run(["fasttrain", "download"], tiny_repo)
    for precision in ("fp32", "amp"):
        if precision == "amp":  # and gradient clipping, on the gradients GradScaler unscaled
            set_params(tiny_repo, {"train": {"grad_clip": 1.0}})
        out = run(["fasttrain", "train", "--parallel", "single", "--precision", precision], tiny_repo)
        assert "\r" not in out.stderr  # not a terminal: lines, never a bar
        assert f"single-{precision}: epoch {EPOCHS}/{EPOCHS}" in out.stderr
        assert ("max grad norm" in out.stderr) == (precision == "amp")

    mux = EventMultiplexer().AddRunsFromDirectory(str(tiny_repo / "tensorboard" / "seed0"))  # the seed's runs
    mux.Reload()
    assert set(mux.Runs()) == {"single-fp32", "single-amp"}  # one run folder per variant
    for variant in ("single-fp32", "single-amp"):
        scalars = set(mux.GetAccumulator(variant).Tags()["scalars"])
        steps = {tag: [e.step for e in mux.Scalars(variant, tag)] for tag in scalars}
        for tag in ("train/loss", "train/lr"):
            assert steps[tag] == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1)), tag
        for tag in ("epoch/test_accuracy", "epoch/images_per_second", "epoch/seconds", "epoch/train_loss"):
            assert steps[tag] == list(range(1, EPOCHS + 1)), tag
        assert all(e.value > 0 for e in mux.Scalars(variant, "epoch/images_per_second"))
        assert {"hparam/images_per_second", "hparam/test_accuracy"} <= scalars

        hparams = hparams_of(mux, variant)
        assert hparams["parallel"] == "single" and hparams["precision"] == variant.split("-")[1]
        assert hparams["model"] == "squeezenet1_1" and hparams["world_size"] == 1
        assert "space_to_depth" in hparams and "channels_last" in hparams  # the speed switches are compared too

    # The GradScaler's loss scale: every step under amp, never without a scaler.
    scale = mux.Scalars("single-amp", "train/loss_scale")
    assert [e.step for e in scale] == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))
    assert all(e.value > 1 for e in scale)
    assert "train/loss_scale" not in mux.GetAccumulator("single-fp32").Tags()["scalars"]

    # The gradients' norm before clipping: every step with grad_clip, never without; the per-epoch
    # table has each epoch's largest. Unscaled: a loss-scaled norm would be thousands of times larger.
    norms = mux.Scalars("single-amp", "train/grad_norm")
    assert [e.step for e in norms] == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))
    assert all(0 < e.value < 1e3 for e in norms)
    assert "train/grad_norm" not in mux.GetAccumulator("single-fp32").Tags()["scalars"]
    with open(tiny_repo / "plots" / "train" / "seed0" / "single-amp.csv") as f:
        epochs = list(csv.DictReader(f))
    for epoch in range(EPOCHS):
        in_epoch = [e.value for e in norms][epoch * STEPS_PER_EPOCH:(epoch + 1) * STEPS_PER_EPOCH]
        assert float(epochs[epoch]["max_grad_norm"]) == pytest.approx(max(in_epoch), rel=1e-3)
    with open(tiny_repo / "plots" / "train" / "seed0" / "single-fp32.csv") as f:
        assert {r["max_grad_norm"] for r in csv.DictReader(f)} == {""}


def test_a_run_resumed_after_dvc_deleted_its_outputs_keeps_its_curves_from_the_start(tiny_repo):
    """tensorboard/<variant> is a DVC output: `dvc repro` deletes it before running the stage again,
    and the resumed run puts back the copy kept beside its checkpoint, then carries on its steps."""
    set_params(tiny_repo, {"data": {"synthetic_train_size": 64}, "train": {"epochs": EPOCHS}, "run": {"log_every_steps": 1}})
    run(["fasttrain", "download"], tiny_repo)
    killed = run(["fasttrain", "train", "--parallel", "single", "--precision", "fp32"], tiny_repo, check=False,
                 env={"FASTTRAIN_FAULT_KILL_RANK_AT": "0:2:1"})  # SIGKILL at epoch 2's first step
    assert killed.returncode != 0 and "epoch 1/2" in killed.stderr
    shutil.rmtree(tiny_repo / "tensorboard" / "seed0" / "single-fp32")  # as dvc repro does before the stage
    again = run(["fasttrain", "train", "--parallel", "single", "--precision", "fp32"], tiny_repo)
    assert "resuming from" in again.stderr

    acc = EventAccumulator(str(tiny_repo / "tensorboard" / "seed0" / "single-fp32"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))
    assert [e.step for e in acc.Scalars("epoch/train_loss")] == list(range(1, EPOCHS + 1))
