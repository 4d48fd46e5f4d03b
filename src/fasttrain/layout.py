"""Where every stage reads and writes, by variant and seed. dvc.yaml names the same paths."""

from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

# The variant matrix (dvc.yaml's too); parallel.py and precision.py give each name its meaning.
PARALLELS = ("single", "dp", "ddp")
PRECISION_NAMES = ("fp32", "autocast", "amp", "bf16")
VARIANTS = tuple(f"{p}-{q}" for p, q in itertools.product(PARALLELS, PRECISION_NAMES))
BASELINE = "single-fp32"


def user_cache(name: str) -> Path:
    """A folder of fasttrain's own in the user's cache ($XDG_CACHE_HOME, else ~/.cache): kept between
    runs and repositories, outside every source tree."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fasttrain" / name


@dataclass(frozen=True)
class Layout:
    """The paths of one seed's runs: each variant's model, metrics, diagnostics, plots and TensorBoard run
    are under a folder of the seed's (models/seed0/single-fp32.pt); the data set and the comparison,
    which is over every seed, are not."""
    root: Path = Path(".")
    seed: int = 0

    @property
    def _seed(self) -> str:
        return f"seed{self.seed}"

    def for_seed(self, seed: int) -> Layout:
        return dataclasses.replace(self, seed=seed)

    @property
    def dataset(self) -> Path:
        return self.root / "data" / "dataset.pt"

    @property
    def raw_dir(self) -> Path:
        return self.root / "data" / "raw"

    def model(self, variant: str) -> Path:
        return self.root / "models" / self._seed / f"{variant}.pt"

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
        return self.root / "tensorboard" / self._seed / variant

    def train_metrics(self, variant: str) -> Path:
        return self.root / "metrics" / "train" / self._seed / f"{variant}.json"

    def train_plot(self, variant: str) -> Path:
        return self.root / "plots" / "train" / self._seed / f"{variant}.csv"

    def train_diagnostics(self, variant: str) -> Path:
        return self.root / "diagnostics" / "train" / self._seed / f"{variant}.json"

    def eval_metrics(self, variant: str) -> Path:
        return self.root / "metrics" / "eval" / self._seed / f"{variant}.json"

    def eval_diagnostics(self, variant: str) -> Path:
        return self.root / "diagnostics" / "eval" / self._seed / f"{variant}.json"

    def confusion_plot(self, variant: str) -> Path:
        return self.root / "plots" / "confusion" / self._seed / f"{variant}.csv"

    @property
    def compare_md(self) -> Path:
        return self.root / "metrics" / "compare.md"

    @property
    def compare_json(self) -> Path:
        return self.root / "metrics" / "compare.json"

    @property
    def compare_plot(self) -> Path:
        return self.root / "plots" / "compare.csv"
