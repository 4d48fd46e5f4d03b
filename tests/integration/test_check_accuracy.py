"""scripts/check_accuracy.py, the evaluation written apart from fasttrain: on a model trained with
train.space_to_depth (its first conv computed another way) it loads into the bare torchvision model
and gives `fasttrain evaluate`'s accuracy, reading the test images from the archive itself."""

import io
import json
import sys
import tarfile

import numpy as np
from PIL import Image
from scratch import REPO, run, set_params

CLASSES = [f"class{c}" for c in range(10)]


def _archive(path, train_per_class=24, test_per_class=10, size=32, seed=0):
    """An image-folder .tar.gz of JPEGs a small net learns: each class a colour and a stripe
    direction, with noise, so accuracy lands far from chance (0.1)."""
    rng = np.random.default_rng(seed)
    hues = rng.integers(30, 226, size=(10, 3))
    with tarfile.open(path, "w:gz") as tar:
        for split, n in (("train", train_per_class), ("test", test_per_class)):
            for c, name in enumerate(CLASSES):
                for i in range(n):
                    img = np.tile(hues[c], (size, size, 1)).astype(np.float64)
                    stripes = np.arange(size) % 8 < 4
                    img[stripes if c % 2 else slice(None), slice(None) if c % 2 else stripes] *= 0.5
                    img += rng.normal(0, 6, img.shape)
                    buf = io.BytesIO()
                    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
                    info = tarfile.TarInfo(f"set/{split}/{name}/{i:04d}.jpg")
                    info.size = buf.tell()
                    buf.seek(0)
                    tar.addfile(info, buf)
    return path


def test_the_independent_evaluation_agrees_with_fasttrain_evaluate(tiny_repo, tmp_path):
    archive = _archive(tmp_path / "set.tar.gz")
    set_params(tiny_repo, {"data": {"source": str(archive)}, "model": {"name": "resnet18"},
                           "train": {"epochs": 6, "batch_size": 40, "lr": 2e-3, "img_size": 40,
                                     "space_to_depth": True},
                           "evaluate": {"flip_tta": True}})
    for cmd in (["fasttrain", "download"], ["fasttrain", "train", "--parallel", "single", "--precision", "fp32"],
                ["fasttrain", "evaluate", "--parallel", "single", "--precision", "fp32"]):
        run(cmd, tiny_repo)
    ours = json.loads((tiny_repo / "metrics/eval/seed0/single-fp32.json").read_text())

    out = run([sys.executable, str(REPO / "scripts/check_accuracy.py"), str(tiny_repo / "models/seed0/single-fp32.pt"),
               str(archive), "--model", "resnet18", "--flip-tta"], tiny_repo).stdout
    theirs = json.loads(out.strip().splitlines()[-1])
    assert theirs["test_images"] == ours["test_images"] == 100
    assert theirs["img_size"] == 40 and theirs["flip_tta"] is True
    assert ours["test_accuracy"] >= 0.5, (theirs, ours)  # learned: a model that did not load would sit near 0.1
    # PIL rounds the resized image to uint8, fasttrain resizes in float: at most a borderline image apart
    assert abs(theirs["test_accuracy"] - ours["test_accuracy"]) <= 0.01, (theirs, ours)


def test_it_names_what_is_missing_in_one_line(tmp_path):
    proc = run([sys.executable, str(REPO / "scripts/check_accuracy.py"), str(tmp_path / "none.pt"), str(tmp_path)],
               tmp_path, check=False)
    assert proc.returncode != 0 and proc.stderr.strip() == f"not found: {tmp_path / 'none.pt'}"
