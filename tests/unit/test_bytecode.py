"""cli.cache_bytecode: where torch has no cached bytecode and Python will not write it, fasttrain's
process keeps its bytecode in a cache folder of its own; anywhere else it changes nothing. A small
package named torch stands in for the real one, each case in a fresh interpreter."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

CODE = "import sys; from fasttrain import cli; cli.cache_bytecode(); import torch; print(sys.pycache_prefix)"


@pytest.fixture
def fake_torch(tmp_path) -> Path:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("STAND_IN = True\n")
    return tmp_path


def prefix(fake_torch: Path, **env) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")} | {
        "PYTHONPATH": os.pathsep.join([str(fake_torch), *filter(None, [os.environ.get("PYTHONPATH")])]), "XDG_CACHE_HOME": str(fake_torch / "cache"), **env}
    proc = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def pyc_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("__init__*.pyc"))


def test_no_bytecode_and_not_allowed_to_write_it_caches_it_apart(fake_torch):
    cache = fake_torch / "cache" / "fasttrain" / "bytecode"
    assert prefix(fake_torch, PYTHONDONTWRITEBYTECODE="1") == str(cache)
    assert pyc_files(cache / fake_torch.relative_to("/") / "torch")  # torch's, written under the cache
    assert not (fake_torch / "torch" / "__pycache__").exists()  # the source tree untouched
    assert prefix(fake_torch, PYTHONDONTWRITEBYTECODE="1") == str(cache)  # read from there next time


def test_python_that_writes_bytecode_is_left_alone(fake_torch):
    assert prefix(fake_torch) == "None"
    assert pyc_files(fake_torch / "torch" / "__pycache__")


def test_torch_with_its_bytecode_is_left_alone(fake_torch):
    prefix(fake_torch)  # Python writes torch's __pycache__
    assert prefix(fake_torch, PYTHONDONTWRITEBYTECODE="1") == "None"


def test_a_prefix_of_the_users_own_or_off_is_kept(fake_torch, tmp_path):
    assert prefix(fake_torch, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(tmp_path / "mine")) == str(tmp_path / "mine")
    assert prefix(fake_torch, PYTHONDONTWRITEBYTECODE="1", FASTTRAIN_BYTECODE_CACHE="off") == "None"
    other = tmp_path / "other"
    assert prefix(fake_torch, PYTHONDONTWRITEBYTECODE="1", FASTTRAIN_BYTECODE_CACHE=str(other)) == str(other)
