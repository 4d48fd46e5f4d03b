"""Every bad input through the real command line: one line naming the problem, a non-zero exit,
and not one file created or changed.

Each case runs `fasttrain.cli.main` (the console script's entry point) in-process, in a work folder
holding a valid params.yaml, a prepared data set and earlier outputs; the case spoils one thing.
In-process, so that "a machine with GPUs" can be one with monkeypatched `torch.cuda` and the whole table
runs in seconds.
"""

from __future__ import annotations

import hashlib
import io
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import test_data
import torch
import yaml
from test_data import _md5, _tar_gz, image_folder_files, make_cifar_tgz

from fasttrain import cli, config, parallel
from fasttrain.data import make_synthetic, save_dataset
from fasttrain.errors import FasttrainError
from fasttrain.layout import Layout

http_root = test_data.http_root  # the fixture: an HTTP server on 127.0.0.1

VALID = {  # tiny and valid: every case breaks exactly one thing
    "data": {"source": "synthetic", "synthetic_train_size": 32, "synthetic_test_size": 10, "workers": 0,
             "pin_memory": False},
    "model": {"name": "squeezenet1_1"},
    "train": {"epochs": 2, "batch_size": 8, "img_size": 32, "scheduler": "none", "device": "cpu"},
    "evaluate": {"batch_size": 10},
}
TRAIN = ["train", "--parallel", "single", "--precision", "fp32"]
TRAIN_DDP = ["train", "--parallel", "ddp", "--precision", "fp32"]
EVALUATE = ["evaluate", "--parallel", "single", "--precision", "fp32"]
DOWNLOAD = ["download"]
MODEL = Path("models") / "seed0" / "single-fp32.pt"  # the first seed's run of the baseline
LONG_TMPDIR = "/tmp/fasttrain-tests-" + "long" * 25  # an AF_UNIX socket's path in it is too long


class Evil:
    """Pickled by reference to this module: torch.load(weights_only=True) must not import it."""

    def __reduce__(self):
        return (print, ("code ran",))


@dataclass
class Case:
    argv: list[str]
    fragment: str  # what the one line must say
    params: dict = field(default_factory=dict)  # laid over VALID
    files: Callable[[Path], None] | None = None  # spoils or adds files in the work folder
    patch: Callable[[pytest.MonkeyPatch], None] | None = None
    exit_code: int = 1


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _own_config(root: Path, **train) -> dict:
    """The resolved config `train` of single-fp32 in `root` would record, with `train` changed."""
    from fasttrain.data import load_dataset
    from fasttrain.train import resolved_config

    resolved = resolved_config(config.load(root / "params.yaml"), "single", "fp32", 1,
                               load_dataset(root / "data" / "dataset.pt"))
    resolved["train"].update(train)
    return resolved


def _own_checkpoint(root: Path) -> Path:
    """Where `train` of single-fp32 in `root` looks for its unfinished run: keyed by the config's hash."""
    return Layout(root).checkpoint_dir("single-fp32", config.config_hash(_own_config(root))) / "last.pt"


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _image_folder_archive(name: str, files: dict[str, bytes]) -> Callable[[Path], None]:
    return lambda root: _tar_gz(root / "in" / name, files) and None


def _truncated(root: Path) -> None:
    whole = root / "in" / "whole.tar.gz"
    _tar_gz(whole, image_folder_files(size=32))
    data = whole.read_bytes()
    _write(root / "in" / "images.tar.gz", data[: len(data) // 2])
    whole.unlink()


def _cifar(root: Path) -> None:
    (root / "in").mkdir(exist_ok=True)
    make_cifar_tgz(root / "in" / "cifar-10-python.tar.gz")


def _missing_class(root: Path) -> None:
    files = {k: v for k, v in image_folder_files().items() if not k.startswith("test/frog/")}
    _tar_gz(root / "in" / "images.tar.gz", files)


def _unreadable_image(root: Path) -> None:
    _tar_gz(root / "in" / "images.tar.gz", {**image_folder_files(), "train/dog/broken.png": b"\x89PNG not really"})


def _training_checkpoint(config_hash: str, done: int, planned: int) -> dict:
    return {"model": {}, "optimizer": {}, "scaler": {}, "rng": [], "config_hash": config_hash,
            "state": {"epoch": done, "global_step": 0, "skipped_steps": 0, "history": []},
            "config": {"train": {"epochs": planned}}}


def _gpu_machine(gpus: int):
    def patch(mp: pytest.MonkeyPatch) -> None:
        mp.setattr(torch.cuda, "is_available", lambda: True)
        mp.setattr(torch.cuda, "device_count", lambda: gpus)
    return patch


def _no_gpu(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(torch.cuda, "is_available", lambda: False)
    mp.setattr(torch.cuda, "device_count", lambda: 0)


CASES = {
    # the variant
    "unknown parallel variant": Case(["train", "--parallel", "fsdp", "--precision", "fp32"],
                                     "'fsdp' is not one of 'single', 'dp', 'ddp'", exit_code=2),
    "unknown precision variant": Case(["evaluate", "--parallel", "single", "--precision", "fp8"],
                                      "'fp8' is not one of", exit_code=2),
    # each numeric param out of range
    "lr zero": Case(TRAIN, "train.lr = 0.0 is out of range: must be a number > 0", {"train": {"lr": 0}}),
    "lr negative": Case(TRAIN, "train.lr = -0.001 is out of range", {"train": {"lr": -1e-3}}),
    "epochs zero": Case(TRAIN, "train.epochs = 0 is out of range: must be an integer >= 1", {"train": {"epochs": 0}}),
    # the seeds: a list of distinct whole numbers, the run's own given by --seed
    "no seeds": Case(TRAIN, "compare.seeds = [] is out of range: must be a list of distinct integers >= 0, at least one",
                     {"compare": {"seeds": []}}),
    "a seed twice": Case(EVALUATE, "compare.seeds = [1, 1] is out of range", {"compare": {"seeds": [1, 1]}}),
    "seeds not a list": Case(TRAIN, "params compare.seeds must be a list of integers, got 3", {"compare": {"seeds": 3}}),
    "a seed that is no whole number": Case(["compare"], "params compare.seeds must be a list of integers, got [0, 1.5]",
                                           {"compare": {"seeds": [0, 1.5]}}),
    "train.seed of an older params.yaml": Case(
        TRAIN, "params key 'train.seed' is no more: the seeds are the list compare.seeds", {"train": {"seed": 3}}),
    "negative --seed": Case([*TRAIN, "--seed", "-1"], "Invalid value for '--seed': -1 is not in the range x>=0.",
                            exit_code=2),
    "batch size zero": Case(TRAIN, "train.batch_size = 0 is out of range", {"train": {"batch_size": 0}}),
    "weight decay negative": Case(TRAIN, "train.weight_decay = -0.1 is out of range", {"train": {"weight_decay": -0.1}}),
    "plateau factor 1": Case(TRAIN, "train.plateau_factor = 1.0 is out of range: must be a number in (0, 1)",
                             {"train": {"plateau_factor": 1.0}}),
    "plateau patience negative": Case(TRAIN, "train.plateau_patience = -1", {"train": {"plateau_patience": -1}}),
    "nproc zero": Case(TRAIN_DDP, "train.nproc = 0 is out of range", {"train": {"nproc": 0}}),
    "max restarts negative": Case(TRAIN, "run.max_restarts = -1", {"run": {"max_restarts": -1}}),
    "CUDA-graph compile mode": Case(TRAIN, "train.compile_mode = 'reduce-overhead' is out of range: must be one of "
                                    "default, max-autotune-no-cudagraphs", {"train": {"compile_mode": "reduce-overhead"}}),
    "log interval zero": Case(TRAIN, "run.log_every_steps = 0", {"run": {"log_every_steps": 0}}),
    "checkpoint interval zero": Case(TRAIN, "run.checkpoint_every = 0", {"run": {"checkpoint_every": 0}}),
    "a key of an older params.yaml": Case(TRAIN, "params key 'train.checkpoint_every' is now 'run.checkpoint_every'",
                                          {"train": {"checkpoint_every": 5}}),
    "a switch that was removed": Case(TRAIN, "params key 'train.relu_after_pool' was removed: it measured 1.6% slower "
                                      "on an H200 (docs/space-to-depth.md); delete it", {"train": {"relu_after_pool": False}}),
    "eval batch zero": Case(EVALUATE, "evaluate.batch_size = 0 is out of range", {"evaluate": {"batch_size": 0}}),
    "workers negative": Case(TRAIN, "data.workers = -1 is out of range", {"data": {"workers": -1}}),
    "synthetic size too small": Case(DOWNLOAD, "data.synthetic_train_size = 5 is out of range",
                                     {"data": {"synthetic_train_size": 5}}),
    "img_size below 63 for alexnet": Case(TRAIN, "train.img_size = 62 is too small for alexnet: it needs at least 63",
                                          {"model": {"name": "alexnet"}, "train": {"img_size": 62}}),
    "img_size below any model": Case(TRAIN, "train.img_size = 4 is out of range", {"train": {"img_size": 4}}),
    "progressive size below alexnet's": Case(
        TRAIN, "train.progressive_size = 48 is too small for alexnet: it needs at least 63",
        {"model": {"name": "alexnet"}, "train": {"img_size": 64, "progressive_epochs": 1, "progressive_size": 48}}),
    "progressive resizing with the torchvision loader": Case(
        TRAIN, "train.progressive_epochs = 1 needs data.loader: gpu (the torchvision loader resizes at one size",
        {"data": {"loader": "torchvision"}, "train": {"progressive_epochs": 1, "progressive_size": 24}}),
    "progressive resizing for every epoch": Case(
        TRAIN, "train.progressive_epochs = 2 leaves no epoch at train.img_size = 32: use fewer than train.epochs = 2",
        {"train": {"progressive_epochs": 2, "progressive_size": 24}}),
    "a switch that another replaced": Case(
        TRAIN, "params key 'train.pad_channels' was removed: space_to_depth took its place, 1.28 times as fast on an "
        "H200 (docs/space-to-depth.md); delete it", {"train": {"pad_channels": True}}),
    "space-to-depth on a first conv of stride 1": Case(
        TRAIN, "train.space_to_depth: true needs a first convolution with a square kernel, one stride > 1 and plain "
        "zero padding, which vgg11's (kernel (3, 3), stride (1, 1)) is not: set it to false",
        {"model": {"name": "vgg11"}, "train": {"space_to_depth": True}}),
    "fused pools on a model without ReLU into a pool in a Sequential": Case(
        TRAIN, "train.fused_max_pool: true needs a model whose ReLU feeds a MaxPool2d (square, dilation 1) in an "
        "nn.Sequential, which resnet18 is not: set it to false",
        {"model": {"name": "resnet18"}, "train": {"fused_max_pool": True}}),
    "gradient clipping at 0": Case(TRAIN, "train.grad_clip = 0.0 is out of range: must be null (off) or a number > 0",
                                   {"train": {"grad_clip": 0}}),
    "gradient clipping a string": Case(TRAIN, "train.grad_clip must be a number or null, got 'yes'",
                                       {"train": {"grad_clip": "yes"}}),
    "adam beta2 of 1": Case(TRAIN, "train.adam_beta2 = 1.0 is out of range: must be a number in (0, 1)",
                            {"train": {"adam_beta2": 1}}),
    "progressive epochs negative": Case(TRAIN, "train.progressive_epochs = -1 is out of range",
                                        {"train": {"progressive_epochs": -1}}),
    # wrong types
    "epochs a string": Case(TRAIN, "train.epochs must be an integer, got 'ten'", {"train": {"epochs": "ten"}}),
    "epochs a float": Case(TRAIN, "train.epochs must be an integer, got 2.5", {"train": {"epochs": 2.5}}),
    "lr a string": Case(TRAIN, "train.lr must be a number, got 'fast'", {"train": {"lr": "fast"}}),
    "augment a string": Case(TRAIN, "data.augment must be true or false, got 'yes'", {"data": {"augment": "yes"}}),
    "nproc a bool": Case(TRAIN_DDP, "train.nproc must be an integer or null, got True", {"train": {"nproc": True}}),
    "section not a mapping": Case(TRAIN, "params section 'train' must be a mapping, got list", {"train": ["lr"]}),
    # names
    "unknown key": Case(TRAIN, "unknown key 'train.lrr' in params (did you mean 'lr'?)", {"train": {"lrr": 1e-3}}),
    "unknown section": Case(TRAIN, "unknown params section 'trian' (did you mean 'train'?)", {"trian": {"lr": 1e-3}}),
    "another tool's name for a key": Case(TRAIN, "unknown key 'train.learning_rate' in params (did you mean 'lr'?)",
                                          {"train": {"learning_rate": 1e-3}}),
    "unknown model": Case(TRAIN, "unknown model.name 'alexnett'", {"model": {"name": "alexnett"}}),
    "unknown scheduler": Case(TRAIN, "one of plateau, onecycle, none", {"train": {"scheduler": "cosine"}}),
    "unknown data source": Case(DOWNLOAD, "unknown data source 'imagenet'", {"data": {"source": "imagenet"}}),
    "missing params file": Case([*TRAIN, "--params", "nope.yaml"], "params file not found: nope.yaml"),
    "params not YAML": Case(TRAIN, "is not valid YAML",
                            files=lambda root: (root / "params.yaml").write_text("train: [unclosed\n")),
    # the world
    "batch smaller than world size": Case(TRAIN_DDP, "train.batch_size = 2 is smaller than the 3 ddp processes",
                                          {"train": {"nproc": 3, "batch_size": 2}}),
    "batch not a multiple of world size": Case(
        TRAIN_DDP, "train.batch_size = 9 does not split evenly over 2 ddp processes: use a multiple of 2",
        {"train": {"nproc": 2, "batch_size": 9}}),
    "more ddp processes than GPUs": Case(TRAIN_DDP, "train.nproc = 2 ddp processes but only 1 GPU(s) visible",
                                         {"train": {"nproc": 2, "device": "auto"}}, patch=_gpu_machine(1)),
    "cuda without a GPU": Case(TRAIN, "train.device = cuda but no GPU is visible",
                               {"train": {"device": "cuda"}}, patch=_no_gpu),
    # data sets and archives
    "missing data source file": Case(DOWNLOAD, "data source not found: in/nope.tar.gz",
                                     {"data": {"source": "in/nope.tar.gz"}}),
    "truncated archive": Case(DOWNLOAD, "archive in/images.tar.gz is truncated or corrupt",
                              {"data": {"source": "in/images.tar.gz"}}, files=_truncated),
    "wrong md5": Case(DOWNLOAD, "md5 mismatch for in/cifar-10-python.tar.gz: expected " + "0" * 32,
                      {"data": {"source": "in/cifar-10-python.tar.gz", "md5": "0" * 32}}, files=_cifar),
    "official md5 by default": Case(DOWNLOAD, "md5 mismatch for in/cifar-10-python.tar.gz: expected c58f30108f",
                                    {"data": {"source": "in/cifar-10-python.tar.gz"}}, files=_cifar),
    "missing class": Case(DOWNLOAD, "class folder(s) missing from in/images.tar.gz/test: frog",
                          {"data": {"source": "in/images.tar.gz"}}, files=_missing_class),
    "unreadable image": Case(DOWNLOAD, "unreadable image in/images.tar.gz/train/dog/broken.png",
                             {"data": {"source": "in/images.tar.gz"}}, files=_unreadable_image),
    "missing data set": Case(TRAIN, "data set not found: data/dataset.pt",
                             files=lambda root: (root / "data" / "dataset.pt").unlink()),
    "missing data set, ddp": Case(TRAIN_DDP, "data set not found: data/dataset.pt; run `fasttrain download`",
                                  files=lambda root: (root / "data" / "dataset.pt").unlink()),  # before any worker
    "data set that is not one": Case(EVALUATE, "not a prepared data set: data/dataset.pt",
                                     files=lambda root: _write(root / "data" / "dataset.pt", b"not a data set")),
    # checkpoints
    "model that is not a checkpoint": Case(EVALUATE, "models/seed0/single-fp32.pt is not a readable checkpoint",
                                           files=lambda root: _write(root / MODEL, b"junk" * 99)),
    "pickle that weights_only refuses": Case(
        EVALUATE, "models/seed0/single-fp32.pt is refused by torch.load(weights_only=True)",
        files=lambda root: _write(root / MODEL, _torch_bytes({"model": Evil()}))),
    "missing model": Case(EVALUATE, "models/seed0/single-fp32.pt not found: train the variant first (dvc repro "
                                    "evaluate@single-fp32-0 trains and evaluates it; make train-single-fp32 trains it "
                                    "alone)", files=lambda root: (root / MODEL).unlink()),
    "missing model of another seed": Case([*EVALUATE, "--seed", "4"], "models/seed4/single-fp32.pt not found"),
    "corrupt last checkpoint": Case(TRAIN, "last.pt is not a readable checkpoint",
                                    files=lambda root: _write(_own_checkpoint(root),
                                                              _torch_bytes(_training_checkpoint("x", 1, 2))[:200])),
    "unfinished checkpoint of another config, copied into this one's folder": Case(
        TRAIN, "last.pt is from another config (hash 0123456789abcdef",
        files=lambda root: _write(_own_checkpoint(root), _torch_bytes(_training_checkpoint("0123456789abcdef", 1, 5)))),
    "resume from a checkpoint of other params": Case(
        [*TRAIN, "--resume", "other.pt"], "other.pt is from another config (hash 0123456789abcdef, now ",
        files=lambda root: _write(root / "other.pt", _torch_bytes({**_training_checkpoint("0123456789abcdef", 1, 2),
                                                                    "config": _own_config(root, lr=0.5)}))),
    "resume from a checkpoint of other params names them": Case(
        [*TRAIN, "--resume", "other.pt"], "train.lr: 0.5 -> 0.0001; restore the params it was made with",
        files=lambda root: _write(root / "other.pt", _torch_bytes({**_training_checkpoint("0123456789abcdef", 1, 2),
                                                                    "config": _own_config(root, lr=0.5)}))),
    "download with no network": Case(
        DOWNLOAD, "offline, set data.source to a local copy (cifar-10-python.tar.gz, or an image-folder archive",
        {"data": {"source": "http://127.0.0.1:9/cifar-10-python.tar.gz"}},  # (nothing listens on port 9)
        files=lambda root: (root / "data" / "raw").mkdir()),  # downloads go there; an empty one is kept
    "resume from a missing checkpoint": Case([*TRAIN, "--resume", "gone.pt"], "checkpoint not found: gone.pt"),
    "resume from a final model": Case([*TRAIN, "--resume", str(MODEL)], f"{MODEL} is not a training checkpoint"),
    "resume from a finished run": Case(
        [*TRAIN, "--resume", "old.pt"], "old.pt is a finished run (2 of 2 epochs): nothing to resume",
        files=lambda root: _write(root / "old.pt", _torch_bytes(_training_checkpoint("?", 2, 2)))),
    "experiments outside a DVC repository": Case(["experiments"],
                                                 "dvc exp show failed: you are not inside of a DVC repository"),
    "serve without a command": Case(["serve"], "Missing argument 'COMMAND...'", exit_code=2),
    "serve with a socket path too long": Case(["serve", "--", "true"], "serve: cannot make its socket",
                                              patch=lambda m: m.setattr(tempfile, "tempdir", LONG_TMPDIR),
                                              files=lambda root: Path(LONG_TMPDIR).mkdir(parents=True, exist_ok=True)),
    "serve with no folder for its socket": Case(["serve", "--", "true"],
                                                "serve: cannot make a folder for its socket in /nonexistent/tmp",
                                                patch=lambda m: m.setattr(tempfile, "tempdir", "/nonexistent/tmp")),
    "serve of a program that does not exist": Case(["serve", "--", "no-such-program-here", "repro"],
                                                   "serve: cannot run 'no-such-program-here': No such file or directory"),
}


@pytest.fixture(scope="module")
def dataset_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("data") / "dataset.pt"
    save_dataset(make_synthetic(VALID["data"]["synthetic_train_size"], VALID["data"]["synthetic_test_size"]), path)
    return path.read_bytes()


def _work_folder(root: Path, dataset: bytes, overrides: dict) -> None:
    params = yaml.safe_load(yaml.safe_dump(VALID))
    for section, values in overrides.items():
        params[section] = values if not isinstance(values, dict) else {**params.get(section, {}), **values}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _write(root / "data" / "dataset.pt", dataset)
    # Earlier outputs, which a failed run must leave exactly as they were.
    _write(root / MODEL, _torch_bytes({"model": {}, "config": {"train": {"epochs": 2}}}))
    _write(root / "metrics" / "train" / "seed0" / "single-fp32.json", b'{"earlier": true}\n')
    (root / "in").mkdir()


def _snapshot(root: Path) -> dict[str, str | None]:
    """Every file (with its content's hash) and every folder under root."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            for p in sorted(root.rglob("*"))}


def _the_error_line(err: str) -> str:
    """stderr ends with exactly one error line, no traceback; progress lines may come before it."""
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("fasttrain: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in err, err
    return errors[0]


def _run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_input_is_one_line_a_non_zero_exit_and_no_output(case, tmp_path, monkeypatch, capsys, dataset_bytes):
    _work_folder(tmp_path, dataset_bytes, case.params)
    if case.files:
        case.files(tmp_path)
    if case.patch:
        case.patch(monkeypatch)
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)

    code, out, err = _run_cli(case.argv, capsys)

    assert code == case.exit_code, err
    assert case.fragment in _the_error_line(err)
    assert out == ""
    assert _snapshot(tmp_path) == before


def test_there_are_at_least_20_cases():
    assert len(CASES) >= 20


def test_a_download_with_the_wrong_md5_keeps_nothing(tmp_path, monkeypatch, capsys, http_root):
    """The URL form: torchvision downloads into data/raw/ before it can check the md5."""
    www, base = http_root
    archive, _ = make_cifar_tgz(www / "cifar-10-python.tar.gz")
    _work_folder(tmp_path, b"earlier data set", {"data": {"source": f"{base}/{archive.name}"}})
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)

    code, _, err = _run_cli(DOWNLOAD, capsys)

    assert code == 1
    line = _the_error_line(err)
    assert f"md5 mismatch for {base}/{archive.name}: expected c58f30108f" in line and _md5(archive) in line
    after = _snapshot(tmp_path)
    assert after.pop("data/raw") is None and not any((tmp_path / "data" / "raw").iterdir())  # the cache folder
    assert after == before  # no download left behind in it, data/dataset.pt untouched


@pytest.mark.parametrize("nproc, gpus, ok", [(1, 1, True), (2, 2, True), (3, 2, False), (2, 0, False)])
def test_check_nproc_on_a_gpu_machine(monkeypatch, nproc, gpus, ok):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    if ok:
        parallel.check_nproc(nproc, "cuda")
    else:
        with pytest.raises(FasttrainError, match=rf"train.nproc = {nproc} ddp processes but only {gpus} GPU"):
            parallel.check_nproc(nproc, "cuda")
    parallel.check_nproc(nproc + 5, "cpu")  # gloo processes on the CPU are not bounded by GPUs
