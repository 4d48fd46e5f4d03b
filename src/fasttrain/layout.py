"""Where every stage reads and writes, by variant. dvc.yaml names the same paths."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

# The variant matrix (dvc.yaml's too); parallel.py and precision.py give each name its meaning.
PARALLELS = ("single", "dp", "ddp")
PRECISION_NAMES = ("fp32", "autocast", "amp", "bf16")
VARIANTS = tuple(f"{p}-{q}" for p, q in itertools.product(PARALLELS, PRECISION_NAMES))
BASELINE = "single-fp32"


@dataclass(frozen=True)
class Layout:
    root: Path = Path(".")

    @property
    def dataset(self) -> Path:
        return self.root / "data" / "dataset.pt"

    @property
    def raw_dir(self) -> Path:
        return self.root / "data" / "raw"

    def model(self, variant: str) -> Path:
        return self.root / "models" / f"{variant}.pt"

    @property
    def checkpoints(self) -> Path:
        """checkpoints/ of the workspace the run belongs to. DVC runs a queued or `--temp` experiment
        in a temporary copy of the repository, gone when the run ends, and names the repository it
        came from in DVC_ROOT (as it does for `dvc repro`, where the two are the same): there a
        preempted queued run's checkpoint outlives it, for the run queued again."""
        return Path(os.environ["DVC_ROOT"]) / "checkpoints" if os.environ.get("DVC_ROOT") else self.root / "checkpoints"

    def checkpoint_dir(self, variant: str, key: str) -> Path:
        """An unfinished run's folder, by variant and by the hash of what it computes (config.config_hash,
        which the checkpoint records): runs of other params, queued side by side, never meet."""
        return self.checkpoints / variant / key

    def tensorboard(self, variant: str) -> Path:
        return self.root / "tensorboard" / variant

    def train_metrics(self, variant: str) -> Path:
        return self.root / "metrics" / "train" / f"{variant}.json"

    def train_plot(self, variant: str) -> Path:
        return self.root / "plots" / "train" / f"{variant}.csv"

    def train_diagnostics(self, variant: str) -> Path:
        return self.root / "diagnostics" / "train" / f"{variant}.json"

    def eval_metrics(self, variant: str) -> Path:
        return self.root / "metrics" / "eval" / f"{variant}.json"

    def eval_diagnostics(self, variant: str) -> Path:
        return self.root / "diagnostics" / "eval" / f"{variant}.json"

    def confusion_plot(self, variant: str) -> Path:
        return self.root / "plots" / "confusion" / f"{variant}.csv"

    @property
    def compare_md(self) -> Path:
        return self.root / "metrics" / "compare.md"

    @property
    def compare_json(self) -> Path:
        return self.root / "metrics" / "compare.json"

    @property
    def compare_plot(self) -> Path:
        return self.root / "plots" / "compare.csv"
