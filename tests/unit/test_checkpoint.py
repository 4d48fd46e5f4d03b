"""Which checkpoint training resumes from, and what deciding it costs."""

import subprocess
import sys

import pytest
import torch

from fasttrain import checkpoint
from fasttrain.errors import FasttrainError
from fasttrain.saved import checkpoint_to_resume

BIG = 64 * 2**20  # float32 values: a 256 MB tensor, as a stand-in for AlexNet's 685 MB with AdamW's state


def _checkpoint(path, epoch, planned=2, digest="abc", values=1000):
    checkpoint.save({"model": {"w": torch.ones(values)}, "optimizer": {}, "scaler": {}, "rng": [],
                     "state": {"epoch": epoch}, "config": {"train": {"epochs": planned}}, "config_hash": digest}, path)
    return path


def test_an_unfinished_run_of_the_same_config_is_resumed_with_its_values(tmp_path):
    ckpt = checkpoint_to_resume(_checkpoint(tmp_path / "last.pt", epoch=1), "abc", explicit=False)
    assert ckpt["state"]["epoch"] == 1 and torch.equal(ckpt["model"]["w"], torch.ones(1000))


def test_a_finished_run_is_not_resumed_and_an_unfinished_one_of_another_config_is_refused(tmp_path):
    assert checkpoint_to_resume(_checkpoint(tmp_path / "done.pt", epoch=2), "abc", explicit=False) is None
    with pytest.raises(FasttrainError, match=r"other.pt is from another config \(hash xyz, now abc\)"):
        checkpoint_to_resume(_checkpoint(tmp_path / "other.pt", epoch=1, digest="xyz"), "abc", explicit=False)


@pytest.mark.slow
def test_learning_that_a_run_is_finished_reads_none_of_its_tensors(tmp_path):
    """A finished run's checkpoint met in checkpoints/ (a finished run removes its own; this one was
    copied in, or left by an older fasttrain) is trained over. Learning that it is finished must not
    read its tensors: in a fresh process, the peak memory grows by far less than the checkpoint's
    256 MB tensor (a full read grows it by all)."""
    path = _checkpoint(tmp_path / "last.pt", epoch=2, values=BIG)
    # VmHWM, this process's own peak (getrusage's ru_maxrss would carry the forking parent's over exec)
    code = """
import re, sys
from pathlib import Path
from fasttrain.saved import checkpoint_to_resume
def peak_kb():
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
before = peak_kb()
found = checkpoint_to_resume(Path(sys.argv[1]), "abc", explicit=False)
print(found is None, (peak_kb() - before) // 1024)
"""
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    finished, grown_mb = out.stdout.split()
    assert finished == "True" and int(grown_mb) < 64, out.stdout


def test_remove_takes_the_checkpoint_and_its_leftover_temporaries_and_nothing_else(tmp_path):
    path = _checkpoint(tmp_path / "last.pt", epoch=2)
    (tmp_path / ".last.pt.abc123.tmp").write_bytes(b"a save killed mid-write")
    (tmp_path / ".other.pt.abc123.tmp").write_bytes(b"another file's")
    (tmp_path / "last.pt.bak").write_bytes(b"the user's")
    checkpoint.remove(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.pt.abc123.tmp", "last.pt.bak"]
    checkpoint.remove(path)  # none there: nothing to do


def test_a_refused_removal_is_one_line_naming_the_file_and_the_reason(tmp_path, monkeypatch):
    import errno
    from pathlib import Path

    from fasttrain.atomic import DiskError

    path = _checkpoint(tmp_path / "last.pt", epoch=2)

    def refused(self, missing_ok=False):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", refused)
    with pytest.raises(DiskError) as e:
        checkpoint.remove(path)
    assert str(e.value) == f"could not remove a finished run's checkpoint {path}: Permission denied (errno EACCES)"
