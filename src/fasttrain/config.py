"""params.yaml: the single home of hyper-parameters, one section per stage, validated up front; the
run section (how a run is watched, checkpointed and restarted) changes no result and no stage lists it.

Every key has a type and a range; an unknown key, a wrong type or a value out of range is a
one-line FasttrainError before any output is touched, so a typo never trains the wrong thing.
What each key means is documented once, in params.yaml's comments; here are its type, default and range.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fasttrain.errors import FasttrainError

LOADERS = ("gpu", "torchvision")
SCHEDULERS = ("plateau", "onecycle", "none")
DEVICES = ("auto", "cpu", "cuda")
# torch.compile's CUDA-graph modes (reduce-overhead, max-autotune) are left out: train.cuda_graphs
# records the whole step, optimizer and GradScaler included, in graphs of its own (graphs.py), and
# compile's graphs would sit inside them.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class DataConfig:
    source: str = "cifar10"  # cifar10 | synthetic | URL or path of cifar-10-python.tar.gz | image-folder archive or folder
    md5: str | None = None  # expected md5 of a cifar-10-python.tar.gz given by URL or path; null = the official one
    synthetic_train_size: int = 5000  # images, source: synthetic only
    synthetic_test_size: int = 1000
    synthetic_image_size: int = 32  # pixels per side
    synthetic_seed: int = 0
    loader: str = "gpu"  # gpu: uint8 set on the device, batched by index; torchvision: per-image PIL path
    augment: bool = False  # random crop (4 px padding) + horizontal flip
    workers: int = 4  # DataLoader worker processes (torchvision loader only)
    pin_memory: bool = True  # torchvision loader only


@dataclass(frozen=True)
class ModelConfig:
    name: str = "alexnet"  # any torchvision classification model, built with num_classes = the data set's


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 20
    batch_size: int = 64  # global: images per optimizer step, summed over all processes/GPUs
    lr: float = 1.0e-4  # AdamW learning rate (peak lr under onecycle)
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    adam_beta2: float = 0.999  # AdamW's second-moment decay (torch's default); its estimates average ~1/(1 - beta2) steps
    grad_clip: float | None = None  # the largest L2 norm of all gradients together; larger ones are scaled down; null: off
    # The run's seed: not a params.yaml key, but one of compare.seeds, which dvc.yaml's matrix passes to
    # each stage as --seed (Params.for_seed); it seeds the initial weights, dropout and the data order.
    seed: int = field(default=0, metadata={"set_by": "--seed"})
    img_size: int = 227  # pixels per side the 32x32 images are resized to
    progressive_epochs: int = 0  # progressive resizing: the first N epochs train at progressive_size (gpu loader)
    progressive_size: int = 160  # pixels per side in those epochs; evaluation is always at img_size
    scheduler: str = "plateau"  # plateau: ReduceLROnPlateau on the epoch's train loss; onecycle; none
    cycle_momentum: bool = True  # onecycle: beta1 cycles 0.95 -> 0.85 -> 0.95 against the lr; false: it stays 0.9
    plateau_factor: float = 0.1
    plateau_patience: int = 2  # epochs without improvement before the lr is cut
    nproc: int | None = None  # ddp processes / dp GPUs; null = every visible GPU (ddp: 2 processes without one)
    nnodes: int = 1  # ddp training: nodes of nproc processes each (docs/several-machines.md)
    sync_bn: bool = False  # ddp only: BatchNorm -> SyncBatchNorm (GPUs only)
    device: str = "auto"  # auto: first GPU if any, else CPU
    channels_last: bool = True
    space_to_depth: bool = False  # the first (strided) convolution computed on space-to-depth input, same function
    fused_max_pool: bool = False  # each ReLU -> max pool pair as one Triton kernel forward, one backward: same function
    cuda_graphs: bool = True  # replay the whole step from CUDA graphs (GPU; dp and the CPU run eagerly); capture time reported apart
    deterministic: bool = False  # bit-identical weights from the same params on one device (deterministic kernels)
    compile: bool = False  # torch.compile; its time is reported apart
    compile_mode: str = "default"  # torch.compile mode: default | max-autotune-no-cudagraphs
    label_smoothing: float = 0.0  # cross-entropy label smoothing in training (evaluation loss never smooths)
    fused_adamw: bool = True  # fused AdamW kernel (CUDA only)
    cudnn_benchmark: bool = True


@dataclass(frozen=True)
class RunConfig:
    """How a run is watched, checkpointed and restarted, not what it computes: no stage lists it."""
    log_every_steps: int = 50  # loss/lr logged to TensorBoard every N optimizer steps
    checkpoint_every: int = 5  # epochs between training checkpoints (none after the last epoch)
    max_restarts: int = 0  # ddp: torchrun restarts a failed worker group this often, resuming from the checkpoint


@dataclass(frozen=True)
class EvaluateConfig:
    batch_size: int = 500  # global, images per forward pass
    flip_tta: bool = False  # mean of the logits of each test image and its mirror image


@dataclass(frozen=True)
class CompareConfig:
    seeds: list[int] = field(default_factory=lambda: [0])  # every variant trains once per seed, in stages of its own


@dataclass(frozen=True)
class Params:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def for_seed(self, seed: int) -> Params:
        """These params for the run of one seed (a stage's --seed, from dvc.yaml's matrix): a copy of the
        train section with its seed set, no other key read (dataclasses.replace would read every one)."""
        train = copy.copy(self.train)
        object.__setattr__(train, "seed", seed)
        return dataclasses.replace(self, train=train)


def params_keys(section_cls) -> list[str]:
    """The keys params.yaml may set in a section: its fields less those a stage's command line sets."""
    return [f.name for f in dataclasses.fields(section_cls) if "set_by" not in f.metadata]


# keys that have moved: an older params.yaml gets told where to, not just "unknown key"
MOVED = {f"train.{k}": f"run.{k}" for k in ("log_every_steps", "checkpoint_every", "max_restarts")}
# switches removed after they were measured and lost: an older params.yaml gets told why and where the evidence is
REMOVED = {
    "train.separable_max_pool": "fused_max_pool took its place (docs/space-to-depth.md)",
    "train.relu_after_pool": "it measured 1.6% slower on an H200 (docs/space-to-depth.md)",
    "train.overlap_optimizer": "it measured 2.1% slower on an H200 (docs/fast-recipe.md)",
    "train.pad_channels": "space_to_depth took its place, 1.28 times as fast on an H200 (docs/space-to-depth.md)",
}
# keys whose meaning changed with their place: an older params.yaml gets told what to write instead
REPLACED = {"train.seed": "the seeds are the list compare.seeds, every variant trained once per seed in stages "
                          "of its own: write e.g. 'compare: {seeds: [3]}' (dvc exp run -S 'compare.seeds=[3]')"}

def _retired(key: str) -> str | None:
    """What to do with a key an older params.yaml may still have: where it moved, or why it was removed."""
    if key in MOVED:
        return f"params key '{key}' is now '{MOVED[key]}': move it there"
    if key in REMOVED:
        return f"params key '{key}' was removed: {REMOVED[key]}; delete it"
    if key in REPLACED:
        return f"params key '{key}' is no more: {REPLACED[key]}"
    return None


# names other tools give these settings, where spelling alone would not lead to ours
ALIASES = {"learning_rate": "lr", "num_epochs": "epochs", "n_epochs": "epochs", "bs": "batch_size",
           "lr_scheduler": "scheduler", "schedule": "scheduler", "wd": "weight_decay",
           "num_workers": "workers", "image_size": "img_size", "model": "name", "arch": "name"}


def did_you_mean(name: str, choices) -> str:
    """' (did you mean X?)' for the choice a misspelt or another tool's name stands for, else ''."""
    choices = list(choices)
    near = [ALIASES[name]] if ALIASES.get(name) in choices else difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f" (did you mean '{near[0]}'?)" if near else ""


# (section, key) -> (predicate, what the valid values are)
_RANGES = {
    ("data", "synthetic_train_size"): (lambda v: v >= 10, "an integer >= 10"),
    ("data", "synthetic_test_size"): (lambda v: v >= 10, "an integer >= 10"),
    ("data", "synthetic_image_size"): (lambda v: v >= 8, "an integer >= 8"),
    ("data", "loader"): (lambda v: v in LOADERS, "one of " + ", ".join(LOADERS)),
    ("data", "workers"): (lambda v: v >= 0, "an integer >= 0"),
    ("data", "md5"): (lambda v: v is None or (len(v) == 32 and all(c in "0123456789abcdef" for c in v.lower())),
                      "null or 32 hex digits"),
    ("data", "source"): (lambda v: v.strip() != "", "cifar10, synthetic, a URL or a local path"),
    ("model", "name"): (lambda v: v.strip() != "", "a torchvision classification model name or path/to/file.py:function"),
    ("train", "epochs"): (lambda v: v >= 1, "an integer >= 1"),
    ("train", "nnodes"): (lambda v: v >= 1, "an integer >= 1"),
    ("train", "batch_size"): (lambda v: v >= 1, "an integer >= 1"),
    ("train", "lr"): (lambda v: v > 0, "a number > 0"),
    ("train", "weight_decay"): (lambda v: v >= 0, "a number >= 0"),
    ("train", "adam_beta2"): (lambda v: 0 < v < 1, "a number in (0, 1)"),
    ("train", "grad_clip"): (lambda v: v is None or v > 0, "null (off) or a number > 0"),
    ("train", "img_size"): (lambda v: v >= 8, "an integer >= 8"),
    ("train", "progressive_epochs"): (lambda v: v >= 0, "an integer >= 0 (0: off)"),
    ("train", "progressive_size"): (lambda v: v >= 8, "an integer >= 8"),
    ("train", "scheduler"): (lambda v: v in SCHEDULERS, "one of " + ", ".join(SCHEDULERS)),
    ("train", "plateau_factor"): (lambda v: 0 < v < 1, "a number in (0, 1)"),
    ("train", "plateau_patience"): (lambda v: v >= 0, "an integer >= 0"),
    ("train", "nproc"): (lambda v: v is None or v >= 1, "null or an integer >= 1"),
    ("train", "device"): (lambda v: v in DEVICES, "one of " + ", ".join(DEVICES)),
    ("train", "compile_mode"): (lambda v: v in COMPILE_MODES, "one of " + ", ".join(COMPILE_MODES)),
    ("train", "label_smoothing"): (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("evaluate", "batch_size"): (lambda v: v >= 1, "an integer >= 1"),
    ("run", "log_every_steps"): (lambda v: v >= 1, "an integer >= 1"),
    ("run", "checkpoint_every"): (lambda v: v >= 1, "an integer >= 1 (epochs)"),
    ("run", "max_restarts"): (lambda v: v >= 0, "an integer >= 0"),
    ("compare", "seeds"): (lambda v: len(v) >= 1 and len(set(v)) == len(v) and min(v) >= 0,
                           "a list of distinct integers >= 0, at least one, e.g. [0, 1, 2]"),
}


def _type_ok(value, annotation) -> bool:
    hint = eval(annotation, vars(typing), {}) if isinstance(annotation, str) else annotation  # noqa: S307 (our own annotations)
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for option in options:
        if option is type(None) and value is None:
            return True
        if option is bool and isinstance(value, bool):
            return True
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if option is str and isinstance(value, str):
            return True
        if typing.get_origin(option) is list and isinstance(value, list):
            return all(_type_ok(v, typing.get_args(option)[0]) for v in value)
    return False


def _yaml_number_hint(value, annotation) -> str:
    """YAML 1.1 (PyYAML, DVC's -S) reads 6e-4 as a string: its floats need a dot and a signed exponent."""
    if annotation not in ("float", "float | None") or not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    mantissa, _, exponent = value.lower().partition("e")
    if not exponent or number != number:  # not an exponent form, or nan
        return ""
    mantissa = mantissa if "." in mantissa else mantissa + ".0"
    exponent = exponent if exponent[0] in "+-" else "+" + exponent
    return f" (YAML reads {value} as a string: write {mantissa}e{exponent})"


def _type_name(annotation) -> str:
    return {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
            "str | None": "a string or null", "int | None": "an integer or null",
            "float | None": "a number or null", "list[int]": "a list of integers"}.get(annotation, annotation)


def _section(cls, section: str, raw) -> object:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise FasttrainError(f"params section '{section}' must be a mapping, got {type(raw).__name__}")
    keys = params_keys(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name in keys}
    unknown = sorted(set(raw) - set(fields))
    retired = [why for why in (_retired(f"{section}.{k}") for k in unknown) if why]
    if retired:
        raise FasttrainError(retired[0])
    if unknown:
        raise FasttrainError(f"unknown key '{section}.{unknown[0]}' in params{did_you_mean(unknown[0], fields)}; "
                             f"valid keys: {', '.join(fields)}")
    values = {}
    for name, value in raw.items():
        annotation = fields[name].type
        if not _type_ok(value, annotation):
            raise FasttrainError(f"params {section}.{name} must be {_type_name(annotation)}, got {value!r}"
                                 + _yaml_number_hint(value, annotation))
        if annotation in ("float", "float | None") and value is not None:
            value = float(value)
        check = _RANGES.get((section, name))
        if check and not check[0](value):
            raise FasttrainError(f"params {section}.{name} = {value!r} is out of range: must be {check[1]}")
        values[name] = value
    return cls(**values)


def from_dict(raw) -> Params:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise FasttrainError("params file must be a mapping of sections: "
                             + ", ".join(f.name for f in dataclasses.fields(Params)))
    sections = {f.name: f for f in dataclasses.fields(Params)}
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise FasttrainError(f"unknown params section '{unknown[0]}'{did_you_mean(unknown[0], sections)}; "
                             f"valid sections: {', '.join(sections)}")
    return Params(**{name: _section(f.default_factory, name, raw.get(name)) for name, f in sections.items()})


def load(path: Path | str = "params.yaml") -> Params:
    path = Path(path)
    if not path.is_file():
        raise FasttrainError(f"params file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise FasttrainError(f"params file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    return from_dict(raw)


def to_dict(params) -> dict:
    return dataclasses.asdict(params)


def config_hash(resolved: dict) -> str:
    """A stable digest of a resolved config, so a checkpoint from another config is never resumed."""
    return hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()[:16]
