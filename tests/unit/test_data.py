"""fasttrain.data: every source form in its real on-disk format, built small in tmp_path.

No network but 127.0.0.1: the URL and `cifar10` sources download a fabricated cifar-10-python.tar.gz
from a local http.server through torchvision's own download code.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import io
import pickle
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from fasttrain.data import (CIFAR10_MD5, Dataset, load_dataset, make_synthetic, prepare, save_dataset)
from fasttrain.errors import FasttrainError

CIFAR_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
PER_BATCH = 3  # images per fabricated batch: 15 train, 3 test


# --- fixtures in the real formats ------------------------------------------------------------

def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _pickle_like_official(obj) -> bytes:
    # The official batches are Python 2 pickles that name numpy.core (numpy 2 writes numpy._core);
    # protocol 2 GLOBALs are newline-terminated, so renaming them keeps the pickle valid.
    return pickle.dumps(obj, protocol=2).replace(b"numpy._core.multiarray", b"numpy.core.multiarray")


def _tar_gz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def make_cifar_tgz(path: Path, seed: int = 0, batches: dict[str, bytes] | None = None):
    """A cifar-10-python.tar.gz in the real layout and pickle format; returns (path, expected Dataset)."""
    rng = np.random.default_rng(seed)
    files, images, labels = {}, {"train": [], "test": []}, {"train": [], "test": []}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (PER_BATCH, 3072), dtype=np.uint8)
        batch_labels = [int(x) for x in rng.integers(0, 10, PER_BATCH)]
        entry = {b"batch_label": name.encode(), b"labels": batch_labels, b"data": data,
                 b"filenames": [f"img{i}.png".encode() for i in range(PER_BATCH)]}
        files[f"cifar-10-batches-py/{name}"] = _pickle_like_official(entry)
        split = "test" if name == "test_batch" else "train"
        images[split].append(data.reshape(-1, 3, 32, 32))
        labels[split] += batch_labels
    meta = {b"label_names": [n.encode() for n in CIFAR_NAMES], b"num_cases_per_batch": PER_BATCH, b"num_vis": 3072}
    files["cifar-10-batches-py/batches.meta"] = _pickle_like_official(meta)
    files["cifar-10-batches-py/readme.html"] = b"<html></html>"
    files.update(batches or {})
    _tar_gz(path, files)
    expected = Dataset(torch.from_numpy(np.concatenate(images["train"])), torch.tensor(labels["train"]),
                       torch.from_numpy(np.concatenate(images["test"])), torch.tensor(labels["test"]),
                       CIFAR_NAMES, "")
    return path, expected


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def handle(self):
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):
            pass  # torchvision's redirect probe opens the URL and closes it unread


class _CuttingHandler(_QuietHandler):
    """Announces the whole file, sends half of it and drops the connection."""

    def do_GET(self):
        data = (Path(self.directory) / self.path.lstrip("/")).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        self.close_connection = True


@contextlib.contextmanager
def _serving(root: Path, handler):
    """(folder, base URL) of an HTTP server on 127.0.0.1 serving that folder with `handler`."""
    root.mkdir(exist_ok=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def http_root(tmp_path):
    with _serving(tmp_path / "www", _QuietHandler) as served:
        yield served


@pytest.fixture
def cutting_http_root(tmp_path):
    """The same folder, but every file is cut off half-way."""
    with _serving(tmp_path / "www", _CuttingHandler) as served:
        yield served


@pytest.fixture
def cifar_tgz(tmp_path):
    return make_cifar_tgz(tmp_path / "cifar-10-python.tar.gz")


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def _jpeg(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def image_folder_files(prefix: str = "", size: int = 8, classes=("cat", "dog", "frog")) -> dict[str, bytes]:
    """train/<class>/* (2 per class) and test/<class>/* (1 per class): PNG, JPEG and a grayscale PNG."""
    rng = np.random.default_rng(1)
    files = {}
    for c, name in enumerate(classes):
        rgb = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        files[f"{prefix}train/{name}/a.png"] = _png(rgb)
        files[f"{prefix}train/{name}/b.jpg"] = _jpeg(np.full((size, size, 3), 40 * c, dtype=np.uint8))
        files[f"{prefix}test/{name}/0.png"] = _png(np.full((size, size), 10 * c, dtype=np.uint8))  # grayscale
    return files


def write_files(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def _assert_same(ds: Dataset, expected: Dataset) -> None:
    assert torch.equal(ds.train_images, expected.train_images)
    assert torch.equal(ds.train_labels, expected.train_labels)
    assert torch.equal(ds.test_images, expected.test_images)
    assert torch.equal(ds.test_labels, expected.test_labels)
    assert ds.classes == expected.classes


def _assert_well_formed(ds: Dataset) -> None:
    for images, labels in ((ds.train_images, ds.train_labels), (ds.test_images, ds.test_labels)):
        assert images.dtype == torch.uint8 and images.ndim == 4 and images.shape[1] == 3
        assert images.is_contiguous()
        assert labels.dtype == torch.int64 and labels.shape == images.shape[:1]
        assert 0 <= int(labels.min()) and int(labels.max()) < len(ds.classes)
    assert ds.classes == sorted(ds.classes)


# --- CIFAR-10 python archive: URL, cifar10, local file -------------------------------------------

def test_url_source_reads_the_cifar_archive_with_its_md5_checked(tmp_path, http_root, cifar_tgz):
    www, base = http_root
    archive, expected = cifar_tgz
    (www / archive.name).write_bytes(archive.read_bytes())
    out = tmp_path / "data" / "dataset.pt"

    ds = prepare(f"{base}/{archive.name}", out, tmp_path / "raw", md5=_md5(archive))

    _assert_same(ds, expected)
    _assert_well_formed(ds)
    # The download is kept as the raw copy; the archive is read in memory, never extracted.
    assert [p.name for p in (tmp_path / "raw").iterdir()] == [archive.name]
    _assert_same(load_dataset(out), expected)
    assert _md5(archive) in load_dataset(out).source


def test_url_source_with_a_wrong_md5_writes_nothing(tmp_path, http_root, cifar_tgz):
    www, base = http_root
    archive, _ = cifar_tgz
    (www / archive.name).write_bytes(archive.read_bytes())
    out = tmp_path / "dataset.pt"

    message = _error(lambda: prepare(f"{base}/{archive.name}", out, tmp_path / "raw", md5="0" * 32))

    assert "expected " + "0" * 32 in message and "got " + _md5(archive) in message and "data.md5" in message
    assert not out.exists()


def test_url_source_defaults_to_the_official_md5(tmp_path, http_root, cifar_tgz):
    www, base = http_root
    archive, _ = cifar_tgz
    (www / archive.name).write_bytes(archive.read_bytes())
    message = _error(lambda: prepare(f"{base}/{archive.name}", tmp_path / "o.pt", tmp_path / "raw"))
    assert f"expected {CIFAR10_MD5}" in message


def test_url_that_does_not_answer_is_one_line_error(tmp_path, http_root):
    _, base = http_root
    message = _error(lambda: prepare(f"{base}/nothing-here.tar.gz", tmp_path / "o.pt", tmp_path / "raw"))
    assert "could not download" in message


def test_a_download_with_no_network_points_to_a_local_data_source(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on: refused, as an offline machine's fetch fails
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    message = _error(lambda: prepare(f"http://127.0.0.1:{port}/cifar-10-python.tar.gz", tmp_path / "o.pt",
                                     tmp_path / "raw"))
    assert message.startswith(f"could not download http://127.0.0.1:{port}/cifar-10-python.tar.gz: ")
    assert message.endswith("offline, set data.source to a local copy (cifar-10-python.tar.gz, or an "
                            "image-folder archive or folder)"), message


def test_a_download_cut_mid_file_keeps_nothing_and_the_next_run_fetches_it_again(tmp_path, cutting_http_root,
                                                                                  http_root, cifar_tgz, monkeypatch):
    www, cutting = cutting_http_root
    _, whole = http_root  # the same folder, served whole
    archive, expected = cifar_tgz
    (www / "cifar-10-python.tar.gz").write_bytes(archive.read_bytes())
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "url", f"{cutting}/cifar-10-python.tar.gz")
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "tgz_md5", _md5(archive))
    out, raw = tmp_path / "dataset.pt", tmp_path / "raw"

    message = _error(lambda: prepare("cifar10", out, raw))
    assert message.startswith(f"md5 mismatch for {cutting}/cifar-10-python.tar.gz: ") and "\n" not in message
    assert f"the {archive.stat().st_size // 2:,} bytes fetched were not kept" in message and "fetches it again" in message
    assert list(raw.iterdir()) == [] and not out.exists()

    monkeypatch.setattr(torchvision.datasets.CIFAR10, "url", f"{whole}/cifar-10-python.tar.gz")
    _assert_same(prepare("cifar10", out, raw), expected)
    assert [p.name for p in raw.iterdir()] == ["cifar-10-python.tar.gz"]


def test_cifar10_source_runs_torchvisions_own_download(tmp_path, http_root, cifar_tgz, monkeypatch):
    www, base = http_root
    archive, expected = cifar_tgz
    (www / "cifar-10-python.tar.gz").write_bytes(archive.read_bytes())
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "url", f"{base}/cifar-10-python.tar.gz")
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "tgz_md5", _md5(archive))

    ds = prepare("cifar10", tmp_path / "dataset.pt", tmp_path / "raw")

    _assert_same(ds, expected)
    assert ds.source.startswith("cifar10")
    assert (tmp_path / "raw" / "cifar-10-python.tar.gz").is_file()
    # A second run reuses the verified download: with the server's copy gone it still works.
    (www / "cifar-10-python.tar.gz").unlink()
    _assert_same(prepare("cifar10", tmp_path / "dataset.pt", tmp_path / "raw"), expected)


def test_local_cifar_archive_is_md5_checked(tmp_path, cifar_tgz):
    archive, expected = cifar_tgz
    _assert_same(prepare(str(archive), tmp_path / "a.pt", tmp_path / "raw", md5=_md5(archive)), expected)
    message = _error(lambda: prepare(str(archive), tmp_path / "b.pt", tmp_path / "raw"))  # official md5
    assert f"expected {CIFAR10_MD5}" in message and "data.md5" in message
    assert not (tmp_path / "b.pt").exists()


def test_cifar_classes_are_sorted_and_labels_follow(tmp_path):
    rng = np.random.default_rng(0)
    names = [b"zebra", b"ant", b"moth"]
    files = {f"cifar-10-batches-py/{b}": _pickle_like_official(
        {b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8), b"labels": [0, 1]})
        for b in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]}
    files["cifar-10-batches-py/batches.meta"] = _pickle_like_official({b"label_names": names})
    archive = _tar_gz(tmp_path / "c.tar.gz", files)
    ds = prepare(str(archive), tmp_path / "o.pt", tmp_path / "raw", md5=_md5(archive))
    assert ds.classes == ["ant", "moth", "zebra"]
    assert ds.test_labels.tolist() == [2, 0]  # zebra, ant


def test_a_batch_pickle_that_builds_anything_else_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    archive, _ = make_cifar_tgz(tmp_path / "c.tar.gz", batches={"cifar-10-batches-py/test_batch": pickle.dumps(Evil())})
    message = _error(lambda: prepare(str(archive), tmp_path / "o.pt", tmp_path / "raw", md5=_md5(archive)))
    assert "test_batch" in message and "builtins.print" in message


# --- image folders ---------------------------------------------------------------------------

def _check_image_folder(ds: Dataset) -> None:
    _assert_well_formed(ds)
    assert ds.classes == ["cat", "dog", "frog"]
    assert ds.train_images.shape == (6, 3, 8, 8) and ds.test_images.shape == (3, 3, 8, 8)
    assert ds.train_labels.tolist() == [0, 0, 1, 1, 2, 2] and ds.test_labels.tolist() == [0, 1, 2]
    files = image_folder_files()
    png = np.array(Image.open(io.BytesIO(files["train/dog/a.png"])).convert("RGB"))
    assert torch.equal(ds.train_images[2], torch.from_numpy(png).permute(2, 0, 1))  # lossless: exact
    assert torch.equal(ds.test_images[2], torch.full((3, 8, 8), 20, dtype=torch.uint8))  # grayscale -> RGB
    assert (ds.train_images[5].float() - 80).abs().max() <= 3  # JPEG: near its flat colour


def test_image_folder_tar_gz_with_a_top_level_folder(tmp_path):
    files = image_folder_files("cifar-mini/")
    files["cifar-mini/README.md"] = b"not an image, not a class"
    files["cifar-mini/train/cat/notes.txt"] = b"ignored: not an image extension"
    archive = _tar_gz(tmp_path / "mini.tar.gz", files)
    ds = prepare(str(archive), tmp_path / "o.pt", tmp_path / "raw")
    _check_image_folder(ds)
    _check_image_folder(load_dataset(tmp_path / "o.pt"))
    assert not (tmp_path / "raw").exists()  # read in memory, nothing extracted


def test_image_folder_zip_without_a_top_level_folder(tmp_path):
    with zipfile.ZipFile(tmp_path / "mini.zip", "w") as zf:
        for name, data in image_folder_files().items():
            zf.writestr(name, data)
    _check_image_folder(prepare(str(tmp_path / "mini.zip"), tmp_path / "o.pt", tmp_path / "raw"))


def test_image_folder_directory(tmp_path):
    root = write_files(tmp_path / "folder", image_folder_files())
    (root / "train" / ".DS_Store").write_bytes(b"hidden files are ignored")
    ds = prepare(str(root), tmp_path / "o.pt", tmp_path / "raw")
    _check_image_folder(ds)
    assert str(root) in ds.source


# --- errors: one line, and out_path never touched ---------------------------------------------

def _error(call) -> str:
    with pytest.raises(FasttrainError) as info:
        call()
    message = str(info.value)
    assert message and "\n" not in message
    return message


def _without(files: dict[str, bytes], prefix: str) -> dict[str, bytes]:
    return {k: v for k, v in files.items() if not k.startswith(prefix)}


def _bad_sources(tmp_path: Path) -> dict[str, tuple[str, str, str | None]]:
    """name -> (source, words the message must contain, md5 to pass)."""
    files = image_folder_files()
    truncated = _tar_gz(tmp_path / "full.tar.gz", image_folder_files("top/"))
    (tmp_path / "half.tar.gz").write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    cifar, _ = make_cifar_tgz(tmp_path / "cifar.tar.gz")
    (tmp_path / "cifar-half.tar.gz").write_bytes(cifar.read_bytes()[: cifar.stat().st_size // 2])
    other_size = dict(files, **{"test/dog/big.png": _png(np.zeros((9, 8, 3), dtype=np.uint8))})
    write_files(tmp_path / "missing-class", _without(files, "test/frog/"))
    write_files(tmp_path / "garbage", dict(files, **{"train/dog/broken.jpg": b"\xff\xd8 not really a jpeg"}))
    write_files(tmp_path / "other-size", other_size)
    write_files(tmp_path / "empty-class", _without(files, "train/cat/"))
    (tmp_path / "empty-class" / "train" / "cat").mkdir()
    write_files(tmp_path / "no-splits", {"images/a.png": files["train/cat/a.png"]})
    (tmp_path / "notes.txt").write_text("hello")
    return {
        "missing class": (str(tmp_path / "missing-class"), "missing from", None),
        "unreadable image": (str(tmp_path / "garbage"), "unreadable image", None),
        "other size": (str(tmp_path / "other-size"), "big.png is 8x9 px", None),
        "empty class": (str(tmp_path / "empty-class"), "no images in", None),
        "no splits": (str(tmp_path / "no-splits"), "no train/ and test/", None),
        "truncated archive": (str(tmp_path / "half.tar.gz"), "truncated or corrupt", None),
        # With its own md5 given, so the check passes and extraction finds the cut.
        "truncated cifar archive": (str(tmp_path / "cifar-half.tar.gz"), "truncated or corrupt",
                                    _md5(tmp_path / "cifar-half.tar.gz")),
        "unknown source": ("cifar100", "unknown data source 'cifar100': use cifar10, synthetic", None),
        "empty source": ("", "unknown data source ''", None),
        "missing path": (str(tmp_path / "nope" / "data.tar.gz"), "not found", None),
        "not an archive": (str(tmp_path / "notes.txt"), "unsupported data source file", None),
    }


_BAD = ["missing class", "unreadable image", "other size", "empty class", "no splits", "truncated archive",
        "truncated cifar archive", "unknown source", "empty source", "missing path", "not an archive"]


@pytest.mark.parametrize("case", _BAD)
def test_bad_source_is_a_one_line_error_and_writes_nothing(tmp_path, case):
    source, words, md5 = _bad_sources(tmp_path)[case]
    out = tmp_path / "out" / "dataset.pt"
    message = _error(lambda: prepare(source, out, tmp_path / "raw", md5=md5))
    assert words in message, message
    assert not out.exists()


def test_md5_of_a_truncated_cifar_archive_is_checked_first(tmp_path):
    cifar, _ = make_cifar_tgz(tmp_path / "cifar.tar.gz")
    (tmp_path / "half.tar.gz").write_bytes(cifar.read_bytes()[: cifar.stat().st_size // 2])
    assert "md5 mismatch" in _error(lambda: prepare(str(tmp_path / "half.tar.gz"), tmp_path / "o.pt", tmp_path / "raw"))


def test_a_failed_prepare_leaves_an_existing_output_byte_for_byte(tmp_path):
    out = tmp_path / "dataset.pt"
    prepare("synthetic", out, tmp_path / "raw", synthetic_train_size=20, synthetic_test_size=10)
    before = out.read_bytes()
    for case, (source, _, md5) in _bad_sources(tmp_path).items():
        _error(lambda: prepare(source, out, tmp_path / "raw", md5=md5))
        assert out.read_bytes() == before, case
    assert [p.name for p in out.parent.glob("*dataset.pt*")] == ["dataset.pt"]  # no temp file left


def test_the_error_names_the_unreadable_file(tmp_path):
    root = write_files(tmp_path / "f", dict(image_folder_files(), **{"train/dog/broken.jpg": b"garbage"}))
    assert "train/dog/broken.jpg" in _error(lambda: prepare(str(root), tmp_path / "o.pt", tmp_path / "raw"))


def test_the_error_names_the_missing_classes(tmp_path):
    files = _without(_without(image_folder_files(), "test/frog/"), "test/cat/")
    root = write_files(tmp_path / "f", files)
    message = _error(lambda: prepare(str(root), tmp_path / "o.pt", tmp_path / "raw"))
    assert "cat, frog" in message and "test" in message


# --- synthetic ---------------------------------------------------------------------------------

def test_synthetic_shapes_dtypes_and_determinism(tmp_path):
    ds = prepare("synthetic", tmp_path / "s.pt", tmp_path / "raw", synthetic_train_size=50,
                 synthetic_test_size=20, synthetic_image_size=24, seed=3)
    _assert_well_formed(ds)
    assert ds.train_images.shape == (50, 3, 24, 24) and ds.test_images.shape == (20, 3, 24, 24)
    assert ds.classes == [f"class{i}" for i in range(10)]
    assert torch.bincount(ds.train_labels, minlength=10).tolist() == [5] * 10  # balanced
    _assert_same(make_synthetic(50, 20, 24, seed=3), ds)
    _assert_same(load_dataset(tmp_path / "s.pt"), ds)
    assert not torch.equal(make_synthetic(50, 20, 24, seed=4).train_images, ds.train_images)


def test_synthetic_sizes_are_validated(tmp_path):
    assert "synthetic_train_size" in _error(lambda: prepare("synthetic", tmp_path / "o.pt", tmp_path / "r",
                                                            synthetic_train_size=0))
    assert not (tmp_path / "o.pt").exists()


def _nearest_class_mean(train_x, train_y, test_x, test_y) -> float:
    means = torch.stack([train_x[train_y == c].mean(0) for c in range(10)])
    return (torch.cdist(test_x, means).argmin(1) == test_y).float().mean().item()


def test_synthetic_is_learnable_from_its_pattern_not_from_one_pixel():
    ds = make_synthetic(2000, 500, 32, seed=0)
    x, y = ds.train_images.float() / 255, ds.train_labels
    tx, ty = ds.test_images.float() / 255, ds.test_labels

    # The oriented stripes, seen phase-free through the low-frequency magnitude spectrum, give the class.
    def spectrum(images, k: int = 8):
        magnitude = torch.fft.fftshift(torch.fft.fft2(images.mean(1)).abs(), dim=(-2, -1))
        return torch.log1p(magnitude[:, 16 - k:16 + k + 1, 16:16 + k + 1]).flatten(1)
    assert _nearest_class_mean(spectrum(x), y, spectrum(tx), ty) > 0.6

    # The class hue is a second, partial cue (as an object's colour is), but no single pixel gives it away.
    colour = _nearest_class_mean(x.mean((2, 3)), y, tx.mean((2, 3)), ty)
    assert 0.2 < colour < 0.9
    assert _nearest_class_mean(x[:, :, 16, 16], y, tx[:, :, 16, 16], ty) < 0.5
    # And it is image-like: noisy, using the whole intensity range, not a few flat colours.
    assert ds.train_images.float().std() > 30
    assert len(torch.unique(ds.train_images[0])) > 50


# --- save / load -------------------------------------------------------------------------------

def test_save_load_round_trip(tmp_path):
    ds = make_synthetic(12, 6, 16, seed=1)
    save_dataset(ds, tmp_path / "nested" / "d.pt")
    back = load_dataset(tmp_path / "nested" / "d.pt")
    _assert_same(back, ds)
    assert back.source == ds.source
    assert torch.load(tmp_path / "nested" / "d.pt", weights_only=True)["classes"] == ds.classes


def test_load_of_a_missing_file(tmp_path):
    message = _error(lambda: load_dataset(tmp_path / "data" / "dataset.pt"))
    assert message == (f"data set not found: {tmp_path / 'data' / 'dataset.pt'}; "
                       "run `fasttrain download` (or `dvc repro download`) first")


@pytest.mark.parametrize("content", ["text", "other torch dict", "wrong dtype", "label out of range",
                                     "pickle with code"])
def test_load_of_a_file_that_is_not_a_prepared_data_set(tmp_path, content):
    path = tmp_path / "d.pt"
    if content == "text":
        path.write_text("hello\n")
    elif content == "other torch dict":
        torch.save({"model": {"w": torch.zeros(2)}}, path)
    elif content == "wrong dtype":
        ds = make_synthetic(10, 10, 8)
        save_dataset(ds, path)
        obj = torch.load(path, weights_only=True)
        obj["train_images"] = obj["train_images"].float()
        torch.save(obj, path)
    elif content == "label out of range":
        ds = make_synthetic(10, 10, 8)
        ds.classes = ds.classes[:5]
        save_dataset(ds, path)
    else:
        torch.save({"x": Path("/")}, path)  # needs a global that weights_only refuses
    assert "not a prepared data set" in _error(lambda: load_dataset(path))
