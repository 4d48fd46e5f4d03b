"""A full disk on every write: the file object's writes raise ENOSPC after N bytes, at
the real write path (atomic.py's temporary file; TensorBoard's event file), for each kind of output.
Each ends with one line naming the path, what was being written and the free space; earlier files
are unchanged and no temporary file is left. A real full filesystem (a small tmpfs) closes it.
"""

import errno
import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from scratch import TINY, checkpoint_file, checkpoint_of, copy_repo, run, set_params

from fasttrain import checkpoint, config, parallel
from fasttrain.atomic import DiskError
from fasttrain.data import make_synthetic, prepare, save_dataset
from fasttrain.layout import Layout
from fasttrain.precision import PRECISIONS
from fasttrain.preemption import EXIT_PREEMPTED
from fasttrain.train import train

AFTER_BYTES = 64  # some bytes land first, as on a disk that fills mid-file


class FullAfter:
    """A file whose writes raise ENOSPC once `budget` bytes are written (a short write first)."""

    def __init__(self, f, budget: int):
        self.f, self.budget = f, budget

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        if len(data) > self.budget:
            self.f.write(bytes(data)[:self.budget])
            self.budget = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.budget -= len(data)
        return self.f.write(data)


def fill_disk_for(monkeypatch, target: Path, from_call: int = 1) -> None:
    """Writes to `target` (through atomic.py's temporary sibling) or, for a folder, to any file in it
    (TensorBoard's event files) fail from its `from_call`-th opening on."""
    import tensorboard.compat.tensorflow_stub.io.gfile as gfile

    import fasttrain.atomic as atomic

    calls = [0]

    def hit(name: str) -> bool:
        name = Path(name)
        if not (name.parent == target.parent and name.name.startswith(f".{target.name}.")) \
                and target not in name.parents:
            return False
        calls[0] += 1
        return calls[0] >= from_call

    real_fdopen, real_open = os.fdopen, io.open

    def fdopen(fd, *args, **kwargs):
        f = real_fdopen(fd, *args, **kwargs)
        return FullAfter(f, AFTER_BYTES) if hit(os.readlink(f"/proc/self/fd/{fd}")) else f

    def open_(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return FullAfter(f, AFTER_BYTES) if "r" not in mode and hit(os.path.abspath(os.fsdecode(file))) else f

    monkeypatch.setattr(atomic.os, "fdopen", fdopen)
    monkeypatch.setattr(gfile, "io", type("io", (), {"open": staticmethod(open_)}))


def one_line(e: DiskError, what: str, path: Path) -> None:
    msg = str(e)
    assert "\n" not in msg, msg
    assert msg.startswith(f"could not write {what} to {path}: No space left on device (errno ENOSPC); "), msg
    assert " MB free there" in msg, msg


def temporaries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*.tmp"))


def _params(epochs: int = 1) -> config.Params:
    return config.from_dict({**TINY, "train": {**TINY["train"], "epochs": epochs, "device": "cpu"}})


def _train(layout: Layout, epochs: int = 1) -> None:
    train(_params(epochs), PRECISIONS["fp32"], parallel.setup("single", "cpu"), layout, log=lambda m: None)


def test_the_data_set(tmp_path, monkeypatch):
    layout = Layout(tmp_path.resolve())
    save_dataset(make_synthetic(64, 10, 32, 0), layout.dataset)
    before = layout.dataset.read_bytes()
    fill_disk_for(monkeypatch, layout.dataset)
    with pytest.raises(DiskError) as e:
        prepare("synthetic", layout.dataset, layout.raw_dir, synthetic_train_size=128, synthetic_test_size=10)
    one_line(e.value, "the prepared data set", layout.dataset)
    assert layout.dataset.read_bytes() == before and temporaries(tmp_path) == []


@pytest.mark.parametrize("kind,what", [("model", "the final model"), ("metrics", "the training metrics"),
                                       ("plot", "the per-epoch table")])
def test_the_final_outputs_of_train(tmp_path, monkeypatch, kind, what):
    layout = Layout(tmp_path.resolve())
    save_dataset(make_synthetic(64, 10, 32, 0), layout.dataset)
    target = {"model": layout.model("single-fp32"), "metrics": layout.train_metrics("single-fp32"),
              "plot": layout.train_plot("single-fp32")}[kind]
    target.parent.mkdir(parents=True)
    target.write_bytes(b"an earlier run's " + kind.encode())
    fill_disk_for(monkeypatch, target)
    with pytest.raises(DiskError) as e:
        _train(layout, epochs=2)
    one_line(e.value, what, target)
    assert target.read_bytes() == b"an earlier run's " + kind.encode() and temporaries(tmp_path) == []
    # epoch 1's checkpoint stays (a finished run's goes only once every output is written): it resumes
    assert checkpoint.load(checkpoint_of(layout, _params(2)))["state"]["epoch"] == 1


def test_a_training_checkpoint(tmp_path, monkeypatch):
    layout = Layout(tmp_path.resolve())
    save_dataset(make_synthetic(64, 10, 32, 0), layout.dataset)
    last = checkpoint_of(layout, _params(3))
    fill_disk_for(monkeypatch, last, from_call=2)  # epoch 1's is written, epoch 2's meets the full disk
    with pytest.raises(DiskError) as e:
        _train(layout, epochs=3)  # (none after the last epoch)
    one_line(e.value, "a training checkpoint", last)
    assert checkpoint.load(last)["state"]["epoch"] == 1 and temporaries(tmp_path) == []


def test_tensorboard(tmp_path, monkeypatch):
    """TensorBoard's writer thread meets the full disk: the run ends with the one line, and the
    thread's own error reaches no traceback (threading.excepthook)."""
    layout = Layout(tmp_path.resolve())
    save_dataset(make_synthetic(64, 10, 32, 0), layout.dataset)
    folder = layout.tensorboard("single-fp32")
    fill_disk_for(monkeypatch, folder)  # any file in it
    printed = _threads_tracebacks(monkeypatch)
    with pytest.raises(DiskError) as e:
        _train(layout)
    one_line(e.value, "the TensorBoard log", folder)
    assert temporaries(tmp_path) == []
    _join_writer_threads()
    assert printed == []


def test_tensorboard_after_the_last_scalars(tmp_path, monkeypatch):
    """The disk fills after the last scalars went in: the writer thread meets it while the scalars are
    written or at close(), where TensorBoard itself drops the thread's error; the writer raises it,
    as the one line, and no traceback is printed."""
    from torch.utils.tensorboard import SummaryWriter

    from fasttrain import report

    printed = _threads_tracebacks(monkeypatch)
    folder = tmp_path / "tensorboard"
    writer = report.GuardedWriter(SummaryWriter(str(folder)), folder)
    writer.add_scalar("epoch/train_loss", 1.0, 1)
    writer.flush()
    fill_disk_for(monkeypatch, folder)  # from here on
    with pytest.raises(DiskError) as e:
        writer.add_text("note", "x" * 200, 2)  # queued, longer than the disk's room: the thread writes it
        writer.close()
    one_line(e.value, "the TensorBoard log", folder)
    _join_writer_threads()
    assert printed == []


def test_a_writer_threads_error_is_raised_by_close_too(tmp_path, monkeypatch):
    """Whichever call comes after the thread's error raises it, close() included (TensorBoard's own
    close() does not): here a thread of TensorBoard's writer-thread class fails before close()."""
    import threading

    from fasttrain import report

    printed = _threads_tracebacks(monkeypatch)

    class _AsyncWriterThread(threading.Thread):  # (the class name the hook knows TensorBoard's by)
        def run(self):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    closed = []
    writer = report.GuardedWriter(type("Writer", (), {"close": lambda self: closed.append(1)})(), tmp_path)
    thread = _AsyncWriterThread()
    thread.start()
    thread.join()
    with pytest.raises(DiskError) as e:
        writer.close()
    one_line(e.value, "the TensorBoard log", tmp_path)
    assert closed == [1] and printed == [] and report.writer_errors == []


def _threads_tracebacks(monkeypatch) -> list:
    """What reaches threading.excepthook from here on (where a thread's exception would be printed)."""
    import threading

    printed = []
    monkeypatch.setattr(threading, "excepthook", printed.append)
    return printed


def _join_writer_threads() -> None:
    import threading

    for thread in threading.enumerate():
        if type(thread).__name__ == "_AsyncWriterThread":
            thread.join(timeout=30)


def _mount_tmpfs(where: Path, size_bytes: int) -> str | None:
    """Mounts a tmpfs of `size_bytes` at `where`; the reason it could not, or None."""
    if os.geteuid() != 0:
        return "a real full filesystem needs a small tmpfs, and mounting one needs root"
    if shutil.which("mount") is None:
        return "a real full filesystem needs a small tmpfs, and this machine has no mount command"
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if proc.returncode:
        return f"a real full filesystem needs a small tmpfs, and `mount -t tmpfs` was refused: {proc.stderr.strip()}"
    return None


@pytest.mark.slow
def test_a_real_full_filesystem_under_checkpoints(tmp_path):
    """checkpoints/ on a tmpfs that holds one checkpoint and a half: of 3 epochs, epoch 1's is written,
    epoch 2's fills the disk. One line, exit 1, epoch 1's checkpoint intact, no temporary file left."""
    repo = copy_repo(tmp_path / "repo")
    for o in (TINY, {"train": {"device": "cpu"}}):
        set_params(repo, o)
    run(["fasttrain", "download"], repo)
    # a checkpoint's size: that of the one a SIGTERM in epoch 2 leaves (a finished run keeps none)
    set_params(repo, {"train": {"epochs": 3}})
    sized = run(["fasttrain", "train", "--parallel", "single", "--precision", "fp32"], repo, check=False,
                env={"FASTTRAIN_FAULT_SIGNAL_AT": "SIGTERM:0:2:1"})
    assert sized.returncode == EXIT_PREEMPTED, sized.stderr[-2000:]
    one = checkpoint_file(repo, "single-fp32").stat().st_size
    for out in ("checkpoints", "models", "metrics", "plots", "tensorboard"):
        shutil.rmtree(repo / out, ignore_errors=True)  # (a stopped run wrote no model)

    mnt = tmp_path / "small-disk"
    reason = _mount_tmpfs(mnt, (one * 3 // 2 + 4095) // 4096 * 4096)
    if reason:
        pytest.skip(reason)
    try:
        (repo / "checkpoints").symlink_to(mnt)
        failed = run(["fasttrain", "train", "--parallel", "single", "--precision", "fp32"], repo, check=False)
        assert failed.returncode == 1, failed.stderr
        last = failed.stderr.strip().splitlines()[-1]
        assert re.match(r"fasttrain: error: could not write a training checkpoint to checkpoints/single-fp32/"
                        r"[0-9a-f]{16}/last\.pt: No space left on device \(errno ENOSPC\); ", last), last
        assert "Traceback" not in failed.stderr and " MB free there" in last
        (kept,) = (mnt / "single-fp32").iterdir()
        assert checkpoint.load(kept / "last.pt")["state"]["epoch"] == 1
        assert sorted(p.name for p in kept.iterdir()) == ["last.pt", "tensorboard"]  # (its copy)
        print(f"real full filesystem: {one:,} B checkpoint, tmpfs of {shutil.disk_usage(mnt).total:,} B: {last}")
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
