"""Ingest a data source (CIFAR-10, a synthetic set, an archive or an image folder) into one prepared form.

Every later stage reads the same thing: a torch file of uint8 NCHW images and int64 labels, written
atomically, so training never decodes images and a failed ingest never leaves a half-written file.
"""

from __future__ import annotations

import collections
import functools
import gzip
import http.client
import io
import lzma
import math
import os
import pickle
import sys
import tarfile
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from fasttrain.vision import torchvision  # first: torchvision without torch._dynamo

from torchvision.datasets.utils import calculate_md5, check_integrity, download_url  # noqa: E402

try:  # deprecated since torchvision 0.29 (moving to TorchCodec); PIL alone still works when it is gone
    from torchvision.io import ImageReadMode, decode_image
except ImportError:  # pragma: no cover
    decode_image = None

from fasttrain.atomic import atomic_write, disk_errors
from fasttrain.errors import FasttrainError

CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"  # official cifar-10-python.tar.gz
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"

CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_BATCH = "test_batch"
CIFAR_META = "batches.meta"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
SOURCE_CHOICES = "use cifar10, synthetic, an http(s) URL of cifar-10-python.tar.gz, or a local archive/folder"
FORMAT = "fasttrain.dataset/1"  # stored in the file so load_dataset can tell ours from any other torch file
SYNTHETIC_CLASSES = 10

# torchvision's libjpeg-turbo/libpng decode is ~4x faster than PIL on small images (60k 32x32 JPEGs:
# ~2 s against ~8 s on one core); PIL reads every other format and gives the verdict on a bad file.
_FAST_DECODE_SUFFIXES = (".jpg", ".jpeg", ".png")
# A pickle can run code; the CIFAR batches only need numpy arrays, so nothing else may be built.
_CIFAR_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("_codecs", "encode"),  # how Python 3 pickles bytes at protocol 2
}
_CORRUPT_ARCHIVE_ERRORS = (tarfile.TarError, EOFError, zlib.error, zipfile.BadZipFile, gzip.BadGzipFile,
                           lzma.LZMAError)


@dataclass
class Dataset:
    """Everything later stages read."""
    train_images: torch.Tensor  # uint8 [N, 3, H, W], contiguous (NCHW)
    train_labels: torch.Tensor  # int64 [N]
    test_images: torch.Tensor  # uint8 [M, 3, H, W]
    test_labels: torch.Tensor  # int64 [M]
    classes: list[str]  # sorted class names, label i = classes[i]
    source: str  # what it was made from (for the record)


def prepare(source: str, out_path: Path, raw_dir: Path, md5: str | None = None,
            synthetic_train_size: int = 5000, synthetic_test_size: int = 1000,
            synthetic_image_size: int = 32, seed: int = 0) -> Dataset:
    """Ingest `source` and write the one prepared form to out_path (atomically). Returns it."""
    ds = ingest(source, Path(raw_dir), md5=md5, synthetic_train_size=synthetic_train_size,
                synthetic_test_size=synthetic_test_size, synthetic_image_size=synthetic_image_size, seed=seed)
    save_dataset(ds, Path(out_path))
    return ds


def ingest(source: str, raw_dir: Path, md5: str | None = None, synthetic_train_size: int = 5000,
           synthetic_test_size: int = 1000, synthetic_image_size: int = 32, seed: int = 0) -> Dataset:
    """Read `source` into memory; raw_dir keeps downloads (reused when their md5 matches)."""
    md5 = md5.lower() if md5 else None
    if not source.strip():  # Path("") is the current folder: never read that by accident
        raise FasttrainError(f"unknown data source '{source}': {SOURCE_CHOICES}")
    if source == "cifar10":
        # Read the class attributes at call time: torchvision's own URL and md5, patchable in tests.
        cls = torchvision.datasets.CIFAR10
        expected = md5 or cls.tgz_md5
        archive = _download(cls.url, raw_dir, cls.filename, expected)
        return _from_archive(archive, f"cifar10 ({cls.url}, md5 {expected})")
    if source == "synthetic":
        return make_synthetic(synthetic_train_size, synthetic_test_size, synthetic_image_size, seed)
    if source.startswith(("http://", "https://")):
        filename = os.path.basename(urlparse(source).path) or "cifar-10-python.tar.gz"
        expected = md5 or CIFAR10_MD5
        archive = _download(source, raw_dir, filename, expected)
        return _from_archive(archive, f"{source} (md5 {expected})")
    path = Path(source).expanduser()
    if path.is_file():
        return _from_local_archive(path, md5)
    if path.is_dir():
        return _read_tree(_tree_of_folder(path), str(path), str(path))
    if (os.sep in source or "/" in source or source.lower().endswith(ARCHIVE_SUFFIXES)):
        raise FasttrainError(f"data source not found: {source} (no such file or folder); {SOURCE_CHOICES}")
    raise FasttrainError(f"unknown data source '{source}': {SOURCE_CHOICES}")


def save_dataset(ds: Dataset, path: Path) -> None:
    """torch.save of a plain dict (loadable with weights_only=True) to a temp file, then os.replace."""
    path = Path(path)
    obj = {"format": FORMAT, "train_images": ds.train_images.contiguous(), "train_labels": ds.train_labels,
           "test_images": ds.test_images.contiguous(), "test_labels": ds.test_labels,
           "classes": list(ds.classes), "source": ds.source}
    atomic_write(path, lambda f: torch.save(obj, f), "the prepared data set")


def require_dataset(path: Path) -> None:
    if not Path(path).is_file():
        raise FasttrainError(f"data set not found: {path}; run `fasttrain download` (or `dvc repro download`) first")


def load_dataset(path: Path) -> Dataset:
    path = Path(path)
    require_dataset(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip, EOF, ...: any of them means "not ours"
        raise FasttrainError(f"not a prepared data set: {path} ({_one_line(e)}); "
                             "run `fasttrain download` (or `dvc repro download`) again") from None
    problem = _dataset_problem(obj)
    if problem:
        raise FasttrainError(f"not a prepared data set: {path} ({problem}); "
                             "run `fasttrain download` (or `dvc repro download`) again")
    return Dataset(obj["train_images"], obj["train_labels"], obj["test_images"], obj["test_labels"],
                   list(obj["classes"]), obj["source"])


def _dataset_problem(obj) -> str | None:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        return f"no '{FORMAT}' format marker"
    for split in ("train", "test"):
        images, labels = obj.get(f"{split}_images"), obj.get(f"{split}_labels")
        if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.ndim != 4 \
                or images.shape[1] != 3:
            return f"{split}_images is not a uint8 [N, 3, H, W] tensor"
        if not isinstance(labels, torch.Tensor) or labels.dtype != torch.int64 or labels.shape != images.shape[:1]:
            return f"{split}_labels is not an int64 tensor with one label per image"
    classes = obj.get("classes")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        return "classes is not a list of names"
    for split in ("train", "test"):
        labels = obj[f"{split}_labels"]
        if len(labels) == 0 or labels.min() < 0 or labels.max() >= len(classes):
            return f"{split}_labels is empty or outside 0..{len(classes) - 1}"
    if not isinstance(obj.get("source"), str):
        return "source is not a string"
    return None


# --- download and archives ---------------------------------------------------------------------

def _download(url: str, raw_dir: Path, filename: str, md5: str) -> Path:
    """torchvision's download_url (its progress bar) into a `.<name>.part` file, renamed once its
    md5 is right: a connection cut mid-file leaves nothing a later run takes for complete, and that
    run fetches the file again. A file with the right md5 already there is reused."""
    raw_dir = Path(raw_dir)
    path, part = raw_dir / filename, raw_dir / f".{filename}.part"
    if path.is_file() and check_integrity(str(path), md5):
        return path
    try:
        with disk_errors(part, f"the download of {url}"):
            download_url(url, str(raw_dir), part.name, md5=md5)
            os.replace(part, path)
    except RuntimeError as e:
        if part.is_file() and "corrupted" in str(e):  # torchvision's wording for an md5 mismatch
            got = calculate_md5(part)  # (a connection cut mid-file reads as a short file, so it ends here too)
            raise FasttrainError(f"{_md5_mismatch(url, md5, got)}; the {part.stat().st_size:,} bytes fetched "
                                 f"were not kept (a connection cut mid-file gives this too): the next run "
                                 f"fetches it again") from None
        raise FasttrainError(f"could not download {url}: {_one_line(e)}") from None
    except (OSError, http.client.HTTPException) as e:  # refused, reset, cut mid-file (IncompleteRead), ...
        raise FasttrainError(f"could not download {url}: {_one_line(e)}; nothing of it was kept, so the next "
                             f"run fetches it again; offline, set data.source to a local copy "
                             f"(cifar-10-python.tar.gz, or an image-folder archive or folder)") from None
    finally:
        part.unlink(missing_ok=True)  # what we fetched is not what was asked for: keep nothing of it
    return path


def _md5_mismatch(what: str, expected: str, got: str) -> str:
    return f"md5 mismatch for {what}: expected {expected}, got {got}; `data.md5` sets the expected one"


def _from_local_archive(path: Path, md5: str | None) -> Dataset:
    if not path.name.lower().endswith(ARCHIVE_SUFFIXES):
        raise FasttrainError(f"unsupported data source file {path}: expected an archive "
                             f"({', '.join(ARCHIVE_SUFFIXES)}) or a folder")
    got = calculate_md5(path)
    # The official archive has a known md5; an image-folder archive is checked only when one is given.
    expected = md5 or (CIFAR10_MD5 if _is_cifar_archive(path) else None)
    if expected is not None and got != expected:
        raise FasttrainError(_md5_mismatch(str(path), expected, got))
    return _from_archive(path, f"{path} (md5 {got})")


def _is_cifar_archive(path: Path) -> bool:
    """Only the first entry is read (the whole archive shares one top-level folder), so the md5 is
    checked before anything in the archive is parsed."""
    try:
        if path.name.lower().endswith(".zip"):
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()[:1]
        else:
            with tarfile.open(path) as tf:
                first = tf.next()
                names = [first.name] if first is not None else []
    except _CORRUPT_ARCHIVE_ERRORS as e:
        raise FasttrainError(f"archive {path} is truncated or corrupt: {_one_line(e)}") from None
    first_name = _clean_name(names[0]) if names else None
    return first_name is not None and first_name.split("/")[0] == CIFAR_FOLDER


def _from_archive(archive: Path, source: str) -> Dataset:
    return _read_tree(_tree_of_archive(archive), str(archive), source)


# --- folders and archives as one tree ----------------------------------------------------------

@dataclass
class _Tree:
    """A folder or an archive as relative POSIX paths: the files worth reading, and every folder.
    Archives are read into memory rather than extracted: writing and deleting 60,000 small files
    cost 6-30 s here against ~3 s to stream the archive, and nothing from it ever touches the disk."""
    files: dict[str, bytes | Path]  # bytes: from an archive; Path: read from disk when needed
    dirs: set[str]


def _visible(name: str) -> bool:
    return not name.startswith(".") and name != "__MACOSX"


def _clean_name(name: str) -> str | None:
    """An archive member's path without ./ or /; None for hidden entries and ones escaping the root."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or ".." in parts or not all(_visible(p) for p in parts):
        return None
    return "/".join(parts)


@functools.cache
def _image_extensions() -> frozenset[str]:
    Image.init()  # registers every format plugin, so each extension PIL can read is known
    return frozenset(ext.lower() for ext in Image.registered_extensions())


def _wanted(name: str) -> bool:
    return name.startswith(CIFAR_FOLDER + "/") or os.path.splitext(name)[1].lower() in _image_extensions()


def _tree_of_folder(folder: Path) -> _Tree:
    files, dirs = {}, set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        rel = Path(dirpath).relative_to(folder).as_posix()
        prefix = "" if rel == "." else rel + "/"
        # Nothing below top/split/class/ is read, so do not walk a deep tree.
        dirnames[:] = [d for d in dirnames if _visible(d)] if prefix.count("/") < 3 else []
        dirs.update(prefix + d for d in dirnames)
        files.update((prefix + f, Path(dirpath) / f) for f in filenames if _visible(f) and _wanted(prefix + f))
    return _Tree(files, dirs)


def _tree_of_archive(archive: Path) -> _Tree:
    _log(f"reading {archive}")
    files, dirs = {}, set()

    def add(raw_name: str, is_dir: bool, read) -> None:
        name = _clean_name(raw_name)
        if name is None:
            return
        parts = name.split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if is_dir:
            dirs.add(name)
        elif _wanted(name):
            files[name] = read()

    try:
        if archive.name.lower().endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                for info in zf.infolist():
                    add(info.filename, info.is_dir(), functools.partial(zf.read, info))
        else:
            with tarfile.open(archive, "r:*") as tf:  # any compression, told from the content
                for member in tf:
                    if member.isdir() or member.isfile():
                        add(member.name, member.isdir(), functools.partial(_read_member, tf, member))
    except _CORRUPT_ARCHIVE_ERRORS as e:
        raise FasttrainError(f"archive {archive} is truncated or corrupt: {_one_line(e)}") from None
    return _Tree(files, dirs)


def _read_member(tf: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    return tf.extractfile(member).read()


def _content(tree: _Tree, name: str, shown: str) -> bytes:
    entry = tree.files[name]
    if isinstance(entry, bytes):
        return entry
    try:
        return entry.read_bytes()
    except OSError as e:
        raise FasttrainError(f"cannot read {shown}/{name}: {_one_line(e)}") from None


def _read_tree(tree: _Tree, shown: str, source: str) -> Dataset:
    """`shown` names the folder or archive in messages; paths inside it follow after a slash."""
    if CIFAR_FOLDER in tree.dirs:
        return _read_cifar(tree, shown, source)
    return _read_image_folder(tree, shown, source)


# --- the CIFAR-10 python batches ---------------------------------------------------------------

class _CifarUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _CIFAR_PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _read_cifar(tree: _Tree, shown: str, source: str) -> Dataset:
    def load(name: str) -> dict:
        path = f"{CIFAR_FOLDER}/{name}"
        if path not in tree.files:
            raise FasttrainError(f"{shown}/{path} is missing")
        try:
            entry = _CifarUnpickler(io.BytesIO(_content(tree, path, shown)), encoding="latin1").load()
        except FasttrainError:
            raise
        except Exception as e:  # pickle raises many types for a broken file
            raise FasttrainError(f"{shown}/{path} is not a readable CIFAR batch: {_one_line(e)}") from None
        if not isinstance(entry, dict):
            raise FasttrainError(f"{shown}/{path} is not a readable CIFAR batch: not a dict")
        # The official files come from Python 2 (str keys); batches written by Python 3 have bytes keys.
        return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in entry.items()}

    meta = load(CIFAR_META)
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in meta.get("label_names", [])]
    if not names:
        raise FasttrainError(f"{shown}/{CIFAR_FOLDER}/{CIFAR_META} has no label_names")
    # Relabel so classes are sorted (a no-op for CIFAR-10, whose names are already in order).
    order = sorted(range(len(names)), key=names.__getitem__)
    new_label = torch.empty(len(names), dtype=torch.int64)
    new_label[torch.tensor(order)] = torch.arange(len(names))

    def split(batch_names) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = [], []
        for name in batch_names:
            entry = load(name)
            data, batch_labels = entry.get("data"), entry.get("labels")
            if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
                    or data.shape[1] != 3 * 32 * 32 or batch_labels is None or len(batch_labels) != len(data):
                raise FasttrainError(f"{shown}/{CIFAR_FOLDER}/{name} is not a CIFAR batch: expected uint8 "
                                     "data [n, 3072] and one label per row")
            # Rows are already channel-major (1024 R, 1024 G, 1024 B), i.e. NCHW after a reshape.
            images.append(torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()))
            batch = torch.as_tensor(list(batch_labels), dtype=torch.int64)
            if len(batch) and (batch.min() < 0 or batch.max() >= len(names)):
                raise FasttrainError(f"{shown}/{CIFAR_FOLDER}/{name} has labels outside 0..{len(names) - 1}")
            labels.append(new_label[batch])
        return torch.cat(images).contiguous(), torch.cat(labels)

    train_images, train_labels = split(CIFAR_TRAIN_BATCHES)
    test_images, test_labels = split((CIFAR_TEST_BATCH,))
    for what, labels in (("train", train_labels), ("test", test_labels)):
        if len(labels) == 0:
            raise FasttrainError(f"the {what} split of {shown}/{CIFAR_FOLDER} is empty")
    return Dataset(train_images, train_labels, test_images, test_labels, sorted(names), source)


# --- image folders -----------------------------------------------------------------------------

def _split_root(tree: _Tree, shown: str) -> str:
    """'' when train/ and test/ are at the top, 'top/' when they are under its one top-level folder."""
    if {"train", "test"} <= tree.dirs:
        return ""
    tops = [d for d in tree.dirs if "/" not in d]
    if len(tops) == 1 and {f"{tops[0]}/train", f"{tops[0]}/test"} <= tree.dirs:
        return tops[0] + "/"
    raise FasttrainError(f"no train/ and test/ folders in {shown}: expected train/<class>/<image> and "
                         "test/<class>/<image>, optionally under one top-level folder")


def _read_image_folder(tree: _Tree, shown: str, source: str) -> Dataset:
    """train/<class>/* and test/<class>/*; classes are the sorted folder names."""
    root = _split_root(tree, shown)
    classes = {}
    for split in ("train", "test"):
        prefix = f"{root}{split}/"
        inside = (d[len(prefix):] for d in tree.dirs if d.startswith(prefix))
        classes[split] = sorted(d for d in inside if "/" not in d)
    if not classes["train"]:
        raise FasttrainError(f"no class folders in {shown}/{root}train: expected train/<class>/<image>")
    for have, other in (("train", "test"), ("test", "train")):
        missing = sorted(set(classes[have]) - set(classes[other]))
        if missing:
            raise FasttrainError(f"class folder(s) missing from {shown}/{root}{other}: {', '.join(missing)} "
                                 "(train and test must have the same classes)")
    names = classes["train"]
    in_folder = collections.defaultdict(list)  # (split, class) -> image paths directly inside it
    for path in tree.files:
        rest = path[len(root):].split("/") if path.startswith(root) else []
        if len(rest) == 3:
            in_folder[(rest[0], rest[1])].append(path)
    splits = {}
    for split in ("train", "test"):
        paths, labels = [], []
        for label, name in enumerate(names):
            found = sorted(in_folder[(split, name)])
            if not found:
                raise FasttrainError(f"no images in {shown}/{root}{split}/{name}: every class needs images "
                                     "in both train/ and test/")
            paths += found
            labels += [label] * len(found)
        _log(f"decoding {len(paths)} {split} images from {shown}")
        splits[split] = (_decode_all(tree, paths, shown), torch.tensor(labels, dtype=torch.int64))
    (train_images, train_labels), (test_images, test_labels) = splits["train"], splits["test"]
    if train_images.shape[2:] != test_images.shape[2:]:
        raise FasttrainError(f"train images are {train_images.shape[3]}x{train_images.shape[2]} px but test images "
                             f"are {test_images.shape[3]}x{test_images.shape[2]} px in {shown}; all must be one size")
    return Dataset(train_images, train_labels, test_images, test_labels, names, source)


def _decode_all(tree: _Tree, paths: list[str], shown: str) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)  # see decode_image import
        first = _decode(tree, paths[0], shown)
        out = torch.empty((len(paths), *first.shape), dtype=torch.uint8)
        out[0] = first
        for i, path in enumerate(paths[1:], start=1):
            image = _decode(tree, path, shown)
            if image.shape != first.shape:
                raise FasttrainError(f"image {shown}/{path} is {image.shape[2]}x{image.shape[1]} px, but {shown}/"
                                     f"{paths[0]} is {first.shape[2]}x{first.shape[1]} px; all must be one size")
            out[i] = image
    return out


def _decode(tree: _Tree, path: str, shown: str) -> torch.Tensor:
    """One image as uint8 [3, H, W] RGB."""
    data = _content(tree, path, shown)
    if decode_image is not None and os.path.splitext(path)[1].lower() in _FAST_DECODE_SUFFIXES:
        try:
            image = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
            if image.dtype == torch.uint8 and image.ndim == 3:
                return image
        except RuntimeError:
            pass  # PIL below gives the verdict and the message
    try:
        with Image.open(io.BytesIO(data)) as im:
            rgb = np.asarray(im.convert("RGB"))
    except UnidentifiedImageError:
        raise FasttrainError(f"unreadable image {shown}/{path}: not an image format PIL knows, or corrupt") from None
    except Exception as e:  # PIL raises many types for a truncated or broken file
        raise FasttrainError(f"unreadable image {shown}/{path}: {_one_line(e)}") from None
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1).contiguous()


# --- the synthetic set -------------------------------------------------------------------------

def make_synthetic(train_size: int, test_size: int, image_size: int = 32, seed: int = 0) -> Dataset:
    """A CIFAR-shaped 10-class set with structure a small CNN learns in an epoch or two.

    Class c = stripes at angle c*18 degrees (4 or 6 periods across the image, by parity) inside a soft
    blob at a random place, in a colour near the class's hue over a random background, plus noise.
    Phase, position, size and both colours vary per image, so no single pixel or mean colour gives the
    class away; the orientation does, and only to something that looks at a neighbourhood.
    """
    for name, value, low in (("synthetic_train_size", train_size, 1), ("synthetic_test_size", test_size, 1),
                             ("synthetic_image_size", image_size, 8)):
        if not isinstance(value, int) or value < low:
            raise FasttrainError(f"{name} must be an integer >= {low}, got {value!r}")
    gen = torch.Generator().manual_seed(seed)
    train_images, train_labels = _synthetic_split(train_size, image_size, gen)
    test_images, test_labels = _synthetic_split(test_size, image_size, gen)
    classes = [f"class{c}" for c in range(SYNTHETIC_CLASSES)]
    return Dataset(train_images, train_labels, test_images, test_labels, classes,
                   f"synthetic (seed {seed}, {train_size} train + {test_size} test, {image_size} px)")


def _synthetic_split(n: int, size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    # Balanced classes in a random order.
    labels = (torch.arange(n) % SYNTHETIC_CLASSES)[torch.randperm(n, generator=gen)]
    images = torch.empty((n, 3, size, size), dtype=torch.uint8)
    chunk = max(1, 2**22 // (size * size))  # bounds the float32 working set to ~50 MB at any size
    for start in range(0, n, chunk):
        images[start:start + chunk] = _synthetic_images(labels[start:start + chunk], size, gen)
    return images, labels


def _synthetic_palette() -> torch.Tensor:
    """10 hues evenly round the colour wheel, saturation 0.6, value 0.8: [10, 3] RGB in 0..1."""
    hue = torch.arange(SYNTHETIC_CLASSES, dtype=torch.float32) / SYNTHETIC_CLASSES
    k = (torch.tensor([5.0, 3.0, 1.0]) + hue[:, None] * 6) % 6
    return 0.8 - 0.8 * 0.6 * torch.clamp(torch.minimum(k, 4 - k), 0, 1)


def _synthetic_images(labels: torch.Tensor, size: int, gen: torch.Generator) -> torch.Tensor:
    n = len(labels)

    def uniform(low: float, high: float, *shape) -> torch.Tensor:
        return low + (high - low) * torch.rand((n, *shape), generator=gen)

    angle = labels * (math.pi / SYNTHETIC_CLASSES) + uniform(-0.06, 0.06)  # radians, ~3.4 degrees of jitter
    periods = torch.where(labels % 2 == 0, 4.0, 6.0) * uniform(0.9, 1.1)  # stripe periods across the image
    phase = uniform(0, 2 * math.pi)
    centre = uniform(0.3, 0.7, 2) * size  # blob centre, pixels
    sigma = uniform(0.22, 0.35) * size  # blob radius, pixels
    fg = _synthetic_palette()[labels] + 0.08 * torch.randn((n, 3), generator=gen)
    bg = uniform(0.1, 0.6, 1).expand(n, 3)  # grey: the class hue stands out, as objects do

    yx = torch.arange(size, dtype=torch.float32)
    y, x = yx[None, :, None], yx[None, None, :]
    along = x * torch.cos(angle)[:, None, None] + y * torch.sin(angle)[:, None, None]
    stripes = 0.5 + 0.5 * torch.sin(2 * math.pi * periods[:, None, None] / size * along + phase[:, None, None])
    r2 = (x - centre[:, 1, None, None]) ** 2 + (y - centre[:, 0, None, None]) ** 2
    blob = torch.exp(-r2 / (2 * sigma[:, None, None] ** 2))
    weight = (blob * stripes)[:, None]  # [n, 1, H, W]: how much foreground colour each pixel takes
    images = bg[:, :, None, None] + weight * (fg - bg)[:, :, None, None]
    images = images + 0.06 * torch.randn(images.shape, generator=gen)
    return (images.clamp(0, 1) * 255).round().to(torch.uint8)


# --- small helpers -----------------------------------------------------------------------------

def _one_line(e: BaseException | str) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def _log(message: str) -> None:
    print(f"data: {message}", file=sys.stderr, flush=True)
