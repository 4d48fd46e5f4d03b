"""Several seeds through the real DVC: compare.seeds makes a train and an evaluate stage per variant and
seed, each writing its own outputs; a seed added runs its own stages and leaves the others' alone, and
`make train-<variant>` trains every seed of the variant. Two variants stand in for the twelve (the
whole matrix over three seeds is what the README's figures come from), so the test stays short."""

import json

import pytest

from scratch import run, set_params, stages_run

from fasttrain.compare import compare, to_markdown
from fasttrain.layout import BASELINE, Layout

pytestmark = pytest.mark.slow

VARIANTS = (BASELINE, "single-bf16")


def _targets(seeds, stages=("evaluate",)) -> list[str]:
    return [f"{stage}@{v}-{s}" for stage in stages for v in VARIANTS for s in seeds]


def test_each_seed_trains_in_stages_of_its_own_and_compare_is_over_them(tiny_repo):
    set_params(tiny_repo, {"compare": {"seeds": [3, 4]}, "train": {"epochs": 3}})
    first = run(["dvc", "repro", *_targets((3, 4))], tiny_repo, timeout=1200)
    assert stages_run(first.stdout) == sorted(["download", *_targets((3, 4), ("train", "evaluate"))]), first.stdout
    weights = {}
    for seed in (3, 4):
        layout = Layout(tiny_repo, seed)
        for variant in VARIANTS:
            train = json.loads(layout.train_diagnostics(variant).read_text())
            assert train["seed"] == seed  # the run's seed is the stage's
            assert layout.eval_metrics(variant).is_file() and layout.confusion_plot(variant).is_file()
            weights[variant, seed] = layout.model(variant).read_bytes()
    assert weights[BASELINE, 3] != weights[BASELINE, 4]  # two seeds, two models
    assert stages_run(run(["dvc", "repro", *_targets((3, 4))], tiny_repo).stdout) == []  # nothing to do again

    # a seed added: its stages alone are stale; the others' outputs are kept as they are
    set_params(tiny_repo, {"compare": {"seeds": [3, 4, 5]}})
    every = _targets((3, 4, 5), ("train", "evaluate"))
    stale = sorted(json.loads(run(["dvc", "status", "--json", *every], tiny_repo).stdout))
    assert stale == sorted(_targets((5,), ("train", "evaluate"))), stale
    # make train-<variant>: the variant's every seed, through DVC (only seed 5's is stale)
    made = run(["make", "-o", ".venv/.installed", "train-single-bf16"], tiny_repo, timeout=1200)
    assert stages_run(made.stdout) == ["train@single-bf16-5"], made.stdout
    run(["dvc", "repro", *_targets((5,))], tiny_repo, timeout=1200)

    table = compare(Layout(tiny_repo), VARIANTS, seeds=(3, 4, 5))
    bf16 = table["variants"]["single-bf16"]
    accuracies = [json.loads(Layout(tiny_repo, s).eval_metrics("single-bf16").read_text())["test_accuracy"]
                  for s in (3, 4, 5)]
    assert bf16["seeds"] == 3 and bf16["test_accuracy"] == pytest.approx(sum(accuracies) / 3, abs=1e-4)
    steady = [len(json.loads(Layout(tiny_repo, s).train_diagnostics("single-bf16").read_text())["speed_samples"][
        "images_per_second"]) for s in (3, 4, 5)]
    assert min(steady) >= 2 and bf16["speed_samples"] == sum(steady)  # every seed's steady samples together
    assert bf16["accuracy_change_low"] <= bf16["accuracy_change"] <= bf16["accuracy_change_high"]
    assert bf16["speed"] in ("faster", "no different", "slower") and bf16["accuracy"] in ("higher", "the same", "lower")
    assert "Over 3 seeds (3, 4, 5)" in to_markdown(table)
