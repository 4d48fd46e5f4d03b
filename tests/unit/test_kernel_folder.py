"""kernel_folder: GPU work in one folder of the user's cache, whatever folder the process runs in, and
back after it; the compile caches' variables kept pointing where they did."""

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from fasttrain import parallel
from fasttrain.evaluate import evaluate_model
from fasttrain.kernel_folder import PATH_VARIABLES, kernel_folder
from fasttrain.precision import PRECISIONS


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "cache" / "fasttrain" / "kernels"


def test_the_block_runs_in_the_cache_folder_and_the_process_goes_back(cache, tmp_path):
    for start in (tmp_path / "repo-a", tmp_path / "repo-b"):  # two repositories, one folder for their kernels
        start.mkdir()
        os.chdir(start)
        with kernel_folder():
            assert Path.cwd() == cache
        assert Path.cwd() == start


def test_the_process_goes_back_when_the_block_fails(cache, tmp_path):
    with pytest.raises(torch.OutOfMemoryError), kernel_folder():
        raise torch.OutOfMemoryError("CUDA out of memory")
    assert Path.cwd() == tmp_path


@pytest.mark.parametrize("name", PATH_VARIABLES)
def test_a_relative_compile_cache_keeps_pointing_where_it_did(cache, tmp_path, monkeypatch, name):
    monkeypatch.setenv(name, "here/compile-cache")
    with kernel_folder():
        assert os.environ[name] == str(tmp_path / "here" / "compile-cache")
    monkeypatch.setenv(name, "/an/absolute/one")
    with kernel_folder():
        assert os.environ[name] == "/an/absolute/one"


def test_without_a_cache_folder_the_work_stays_where_it_is(tmp_path, monkeypatch):
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    monkeypatch.chdir(tmp_path)
    with kernel_folder():
        assert Path.cwd() == tmp_path


def test_evaluation_runs_in_the_cache_folder(cache, tmp_path):
    class Where(nn.Module):
        def forward(self, x):
            seen.append(Path.cwd())
            return torch.zeros(len(x), 2)

    seen = []
    batches = [(torch.zeros(2, 1, 1, 1), torch.tensor([0, 1]))]
    evaluate_model(Where(), batches, PRECISIONS["fp32"], parallel.Runtime("single", torch.device("cpu")), 2)
    assert seen == [cache] and Path.cwd() == tmp_path


def test_trainings_warm_up_runs_in_the_cache_folder(cache, tmp_path, monkeypatch):
    """train.train's warm-up (compile, capture, the first step at every shape) in the cache folder;
    the data set, model and checkpoints before and after it in the process's own."""
    from types import SimpleNamespace

    from fasttrain import train

    class Seen(Exception):
        pass

    where = {}
    run = SimpleNamespace(variant="single-fp32", cfg=SimpleNamespace(epochs=1, deterministic=False), train_loader=[])

    def prepare(*args):
        where["prepare"] = Path.cwd()
        return run

    def warm_up(r):
        where["warm_up"] = Path.cwd()
        raise Seen

    monkeypatch.setattr(train, "_prepare", prepare)
    monkeypatch.setattr(train, "_warm_up", warm_up)
    with pytest.raises(Seen):
        train.train(None, PRECISIONS["fp32"], parallel.Runtime("single", torch.device("cpu")), None)
    assert where == {"prepare": tmp_path, "warm_up": cache} and Path.cwd() == tmp_path


def test_blocks_in_threads_and_nested_ones_go_back_once_the_last_ends(cache, tmp_path):
    """The process has one folder: evaluations in threads (as the tests run ranks) and a block inside
    another leave it where it was, whatever order they end in."""
    import threading

    entered, leave = threading.Barrier(3), threading.Event()

    def block():
        with kernel_folder():
            entered.wait()
            leave.wait()

    threads = [threading.Thread(target=block) for _ in range(2)]
    for t in threads:
        t.start()
    entered.wait()
    assert Path.cwd() == cache
    with kernel_folder():
        leave.set()
        threads[0].join()
        assert Path.cwd() == cache
    threads[1].join()
    assert Path.cwd() == tmp_path


def test_tensorboard_keeps_writing_to_the_runs_folder_from_inside(cache, tmp_path):
    """TensorBoard's writer thread opens its event file afresh for every write: while warm-up or an
    evaluation runs in the cache folder, its writes still go to the run's folder."""
    from types import SimpleNamespace

    from fasttrain import report
    from fasttrain.layout import Layout

    run = SimpleNamespace(layout=Layout(), variant="single-fp32", state=SimpleNamespace(epoch=0, global_step=0))
    writer = report.open_tensorboard(run, resumed_elsewhere=False)
    writer.add_scalar("loss", 1.0, 1)
    writer.flush()
    with kernel_folder():
        writer.add_scalar("loss", 0.5, 2)
        writer.flush()
    writer.close()
    events = list((tmp_path / "tensorboard" / "seed0" / "single-fp32").glob("events.out.tfevents.*"))
    assert len(events) == 1 and not list(cache.iterdir())
