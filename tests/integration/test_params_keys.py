"""dvc.yaml: each stage lists exactly the params keys it reads, over every key of params.yaml, but
those of the run section, which change no result: train reads them, no stage lists them, and a
change to one re-runs nothing.

What a stage reads is recorded, not listed by hand: the stages run in-process on params whose every
attribute read is noted (`reads`). Then, for every key, a change to it must make `dvc status` name
exactly the stages that read it; and each stage's command, given a params.yaml holding only the keys
its dvc.yaml entry lists (the rest at their defaults), must produce what it produces with them all.
"""

import dataclasses
import json
import shutil
import socket
from pathlib import Path

import pytest
import torch
import yaml
from scratch import TINY, copy_repo, run, set_params

from fasttrain import cli, config, parallel
from fasttrain.layout import BASELINE, VARIANTS, Layout

pytestmark = pytest.mark.slow

STAGES = ("download", "train", "evaluate", "compare")
REPO = Path(__file__).parents[2]
SEED = 7  # the runs' seed, not the default 0: a stage that ran another seed's would show
# params.yaml, tiny, with values unlike the defaults wherever a stage might read a key it does not
# list, so that reading one shows.
FULL = yaml.safe_load((REPO / "params.yaml").read_text())
for section, values in {**TINY, "data": {**TINY["data"], "synthetic_train_size": 64, "synthetic_seed": 3,
                                         "augment": True},
                        "compare": {"seeds": [SEED]},
                        "train": {**TINY["train"], "device": "cpu", "nproc": 1, "epochs": 2,
                                  "weight_decay": 0.05}}.items():
    FULL[section].update(values)
FULL["run"].update(max_restarts=1)
KNOWN_UNLISTED: dict[str, str] = {}  # keys of a result section a stage reads without listing them: none
UNLISTED = "run"  # the section whose keys change no stage's result: listed by none


def result_key(key: str) -> bool:
    return key.split(".")[0] != UNLISTED


def every_key() -> list[str]:
    return [f"{s.name}.{k}" for s in dataclasses.fields(config.Params) for k in config.params_keys(s.default_factory)]


def listed(stage: str) -> set[str]:
    """The keys dvc.yaml lists for `stage` (a whole section stands for each of its keys)."""
    entries = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage].get("params", [])
    return {k for k in every_key() for e in entries if k == e or k.startswith(f"{e}.")}


def recording(params: config.Params, seen: set[str]) -> config.Params:
    """`params`, but every read of a key (attribute access, asdict, replace) is added to `seen`."""
    def wrap(section: str, values):
        names = {f.name for f in dataclasses.fields(values)}

        def getattribute(self, name):
            if name in names:
                seen.add(f"{section}.{name}")
            return object.__getattribute__(self, name)

        cls = type(values)
        recorder = type(cls.__name__, (cls,), {"__getattribute__": getattribute})
        return recorder(**{n: object.__getattribute__(values, n) for n in names})

    return config.Params(**{s.name: wrap(s.name, getattr(params, s.name)) for s in dataclasses.fields(params)})


def cli_run(argv: list[str]) -> None:
    """The console script's entry point, in-process; it exits only on an error (on stderr)."""
    try:
        cli.main(argv)
    except SystemExit as e:
        raise AssertionError(f"fasttrain {' '.join(argv)} exited {e.code}") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def variant_argv(stage: str, parallel_name: str) -> list[str]:
    """The stage's command as dvc.yaml's matrix writes it, --seed included."""
    return [stage, "--parallel", parallel_name, "--precision", "fp32", "--seed", str(SEED)]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """Every stage in-process on FULL, each variant path (single, dp, the ddp launcher, a ddp worker),
    the keys each stage reads, and the outputs."""
    root = tmp_path_factory.mktemp("full")
    (root / "params.yaml").write_text(yaml.safe_dump(FULL))
    reads = {stage: set() for stage in STAGES}
    mp = pytest.MonkeyPatch()
    real_load = config.load
    stage_now = []
    mp.setattr(config, "load", lambda path="params.yaml": recording(real_load(path), reads[stage_now[-1]]))
    mp.setattr(parallel, "launch", lambda *args, **kwargs: None)  # the launcher's reads, then no workers
    mp.chdir(root)
    try:
        def stage(name, argv, env=None):
            stage_now.append(name)
            with pytest.MonkeyPatch.context() as worker:
                for k, v in (env or {}).items():
                    worker.setenv(k, v)
                cli_run(argv)

        stage("download", ["download"])
        torchrun = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
        for name in ("train", "evaluate"):
            for parallel_name in ("single", "dp", "ddp"):
                stage(name, variant_argv(name, parallel_name))
            stage(name, variant_argv(name, "ddp"), {**torchrun, "MASTER_PORT": str(free_port())})  # a worker
        for variant in VARIANTS:  # compare reads all twelve: the single-fp32 figures stand in for the rest
            layout = Layout(root, SEED)
            for path in (layout.train_metrics, layout.eval_metrics, layout.train_diagnostics, layout.eval_diagnostics):
                if variant != BASELINE:
                    shutil.copy(path(BASELINE), path(variant))
        stage("compare", ["compare"])
    finally:
        mp.undo()
    return root, reads


def test_params_yaml_holds_every_key_the_stages_can_read():
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert sorted(f"{s}.{k}" for s, keys in params.items() for k in keys) == sorted(every_key())


def test_changing_any_key_makes_dvc_rerun_exactly_the_stages_that_read_it(full_run, tmp_path):
    from dvc.repo import Repo

    _, reads = full_run
    assert reads["train"] and reads["evaluate"] and reads["download"] and reads["compare"] == {"compare.seeds"}
    repo = copy_repo(tmp_path / "repo")
    set_params(repo, FULL)
    layout = Layout(repo, SEED)  # stand-in outputs: `dvc commit` records them and the params, nothing runs
    outs = [layout.dataset, layout.compare_json, layout.compare_md, layout.compare_plot]
    for v in VARIANTS:
        outs += [layout.model(v), layout.train_metrics(v), layout.train_diagnostics(v), layout.train_plot(v),
                 layout.eval_metrics(v), layout.eval_diagnostics(v), layout.confusion_plot(v)]
    for v in VARIANTS:  # a folder output: one file in it
        outs.append(layout.tensorboard(v) / "events")
    for path in outs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n")
    run(["dvc", "commit", "--force"], repo)
    original = (repo / "params.yaml").read_text()

    rerun, wrong = {}, {}
    for key in every_key():
        section, name = key.split(".")
        value = getattr(getattr(config.from_dict(FULL), section), name)
        changed = (not value if isinstance(value, bool) else 1 if value is None else
                   value + "x" if isinstance(value, str) else value + [SEED + 1] if isinstance(value, list)
                   else value * 2 + 1)
        set_params(repo, {section: {name: changed}})
        with Repo(str(repo)) as dvc:
            names = [stage.rsplit(":", 1)[-1] for stage in dvc.status()]
        (repo / "params.yaml").write_text(original)
        added = [n for n in names if n.endswith(f"-{SEED + 1}")]  # a seed added to compare.seeds: its stages
        if added:
            assert key == "compare.seeds" and sorted(added) == sorted(
                f"{s}@{v}-{SEED + 1}" for s in ("train", "evaluate") for v in VARIANTS), (key, names)
        stages = {n.split("@")[0] for n in names if n not in added}  # and of the others, those that read the key
        for matrix_stage in stages & {"train", "evaluate"}:  # every variant of a stage, or none
            assert sorted(n for n in names if n.startswith(f"{matrix_stage}@")) == sorted(
                f"{matrix_stage}@{v}-{SEED}" for v in VARIANTS), (key, names)
        rerun[key] = stages
        readers = {stage for stage in STAGES if key in reads[stage]}
        if result_key(key) and stages != readers:
            wrong[key] = f"read by {sorted(readers)}, listed by {sorted(stages)}"
    assert wrong == KNOWN_UNLISTED
    assert all(rerun[key] for key in every_key() if result_key(key)), "a key no stage lists"
    unlisted = {key: sorted(rerun[key]) for key in every_key() if not result_key(key)}
    assert unlisted and unlisted == {key: [] for key in unlisted}, f"a run key re-runs a stage: {unlisted}"
    assert set().union(*(reads[s] for s in STAGES)) >= set(unlisted), "a run key no stage reads"


def _reduced(stage: str) -> dict:
    keys = listed(stage)
    out = {}
    for section, values in FULL.items():
        kept = {k: v for k, v in values.items() if f"{section}.{k}" in keys}
        if kept:
            out[section] = kept
    return out


def test_each_stage_does_the_same_with_only_the_keys_it_lists(full_run, tmp_path, monkeypatch):
    """Run keys left at their defaults too (checkpoints every 5 epochs, not every one; TensorBoard every
    50 steps, not every step): the same model and the same headline metrics."""
    full, _ = full_run
    assert _reduced("train").get(UNLISTED) is None and FULL[UNLISTED] != yaml.safe_load(
        (REPO / "params.yaml").read_text())[UNLISTED]
    monkeypatch.chdir(tmp_path)
    assert _reduced("download")["data"].keys() == {"source", "md5", "synthetic_train_size", "synthetic_test_size",
                                                   "synthetic_image_size", "synthetic_seed"}
    for stage, argv in (("download", ["download"]), ("train", variant_argv("train", "single")),
                        ("evaluate", variant_argv("evaluate", "single"))):
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(_reduced(stage)))
        cli_run(argv)

    a, b = torch.load(full / "data" / "dataset.pt"), torch.load(tmp_path / "data" / "dataset.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k]
                                        for k in a)
    a, b = (torch.load(Layout(root, SEED).model(BASELINE), weights_only=True)["model"] for root in (full, tmp_path))
    assert all(torch.equal(a[k], b[k]) for k in a)
    layout, reduced = Layout(full, SEED), Layout(tmp_path, SEED)
    untimed = lambda m: {k: v for k, v in m.items() if "seconds" not in k and "memory" not in k  # noqa: E731
                         and k != "images_per_second"}
    for metrics in (Layout.train_metrics, Layout.eval_metrics):  # the headline figures; the diagnostics
        # differ where they should: checkpoints written (every epoch in the full run, none here)
        assert untimed(json.loads(metrics(reduced, BASELINE).read_text())) == untimed(
            json.loads(metrics(layout, BASELINE).read_text()))
    assert (json.loads(layout.train_diagnostics(BASELINE).read_text())["checkpoints_written"],
            json.loads(reduced.train_diagnostics(BASELINE).read_text())["checkpoints_written"]) == (1, 0)

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(_reduced("compare")))  # compare.seeds alone
    for variant in VARIANTS:  # the full run's metrics, so the two tables can be compared
        for path in (Layout.train_metrics, Layout.eval_metrics, Layout.train_diagnostics, Layout.eval_diagnostics):
            shutil.copy(path(layout, variant), path(reduced, variant))
    cli_run(["compare"])
    assert reduced.compare_json.read_text() == layout.compare_json.read_text()
