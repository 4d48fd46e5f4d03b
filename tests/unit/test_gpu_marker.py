"""tests/conftest.py: a run says how many GPU-marked tests it did not run."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import torch

SAMPLE = '''
import pytest

@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2])
def test_on_the_gpu(n):
    pass

@pytest.mark.gpu
def test_deselected_by_name():
    pass

def test_anywhere():
    pass
'''


def test_a_run_counts_the_gpu_tests_it_skipped_and_deselected(tmp_path):
    shutil.copy(Path(__file__).parents[1] / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
                          "--rootdir", str(tmp_path), "-k", "not by_name", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path).stdout
    skipped = 0 if torch.cuda.is_available() else 2
    assert f"GPU tests not run: {skipped} skipped, 1 deselected" in out, out
    assert f"{4 - 1 - skipped} passed" in out, out


def test_the_files_started_first_exist():
    # Loaded from its file under its own name: "conftest" in sys.modules may be another folder's.
    tests = Path(__file__).parents[1]
    spec = importlib.util.spec_from_file_location("tests_root_conftest", tests / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    assert [f for f in conftest.LONGEST_FIRST if not (tests / f).is_file()] == []
