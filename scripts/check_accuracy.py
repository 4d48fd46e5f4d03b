#!/usr/bin/env python3
"""A trained model's test accuracy, measured without fasttrain: a check of `fasttrain evaluate`.

    python scripts/check_accuracy.py models/single-bf16.pt cifar10-jpeg.tar.gz [--flip-tta]

It shares no code with fasttrain. The model is a bare torchvision one (`--model`, default alexnet)
that loads the checkpoint's weights with strict=True, so a model that trained with fasttrain's
speed switches (space_to_depth, fused_max_pool, channels_last, compile) must still be that
torchvision model. The test images are read from the data set as it was given: an image-folder
archive (.tar.gz) or folder (test/<class>/<image>, classes in sorted order), or the official
cifar-10-python.tar.gz. Each image goes through PIL's Resize(img_size) and ToTensor, as a
torchvision user would feed it; img_size is the one the checkpoint trained at unless --img-size says.
With --flip-tta an image's logits are the mean of its own and its mirror image's, as
evaluate.flip_tta does. Prints the accuracy, and one JSON line with it.
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import sys
import tarfile
from pathlib import Path

import torch
import torchvision
from PIL import Image
from torchvision import transforms

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".gif", ".tif", ".tiff", ".webp")


def _folder_entries(names: list[str]) -> list[tuple[str, str]]:
    """(class, name) of each test image in an image-folder tree: .../test/<class>/<image>."""
    out = []
    for name in names:
        parts = Path(name).parts
        if len(parts) >= 3 and parts[-3] == "test" and name.lower().endswith(IMAGE_SUFFIXES) \
                and not parts[-1].startswith("."):
            out.append((parts[-2], name))
    return out


def read_test_set(source: Path) -> tuple[list[Image.Image], list[int], list[str]]:
    """Test images (PIL, RGB), their labels and the class names."""
    if source.is_dir():
        entries = _folder_entries([str(p.relative_to(source)) for p in source.rglob("*") if p.is_file()])
        opened = {name: Image.open(source / name) for _, name in entries}
    else:
        with tarfile.open(source) as tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
            official = [n for n in members if n.endswith("cifar-10-batches-py/test_batch")]
            if official:
                batch = pickle.loads(tar.extractfile(members[official[0]]).read(), encoding="bytes")
                meta = next(n for n in members if n.endswith("cifar-10-batches-py/batches.meta"))
                classes = [c.decode() for c in pickle.loads(tar.extractfile(members[meta]).read(),
                                                            encoding="bytes")[b"label_names"]]
                data = batch[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
                return [Image.fromarray(a) for a in data], list(batch[b"labels"]), classes
            entries = _folder_entries(list(members))
            opened = {name: Image.open(io.BytesIO(tar.extractfile(members[name]).read())) for _, name in entries}
    if not entries:
        sys.exit(f"no test images in {source}: expected test/<class>/<image> (an image-folder archive or "
                 f"folder) or cifar-10-python.tar.gz")
    classes = sorted({c for c, _ in entries})
    entries.sort()
    return ([opened[name].convert("RGB") for _, name in entries], [classes.index(c) for c, _ in entries], classes)


@torch.no_grad()
def accuracy(model: torch.nn.Module, images: list[Image.Image], labels: list[int], img_size: int,
             flip_tta: bool, batch_size: int, device: torch.device) -> float:
    to_input = transforms.Compose([transforms.Resize(img_size), transforms.ToTensor()])
    model.eval().to(device)
    correct = 0
    for start in range(0, len(images), batch_size):
        x = torch.stack([to_input(im) for im in images[start:start + batch_size]]).to(device)
        logits = model(x)
        if flip_tta:
            logits = (logits + model(x.flip(-1))) / 2
        y = torch.tensor(labels[start:start + batch_size], device=device)
        correct += int((logits.argmax(1) == y).sum())
    return correct / len(images)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a model fasttrain trained (models/<variant>.pt)")
    parser.add_argument("data", type=Path, help="the data set: image-folder archive or folder, or cifar-10-python.tar.gz")
    parser.add_argument("--model", default="alexnet", help="torchvision model name (default: alexnet)")
    parser.add_argument("--img-size", type=int, help="side the images are resized to (default: the checkpoint's)")
    parser.add_argument("--flip-tta", action="store_true", help="mean logits of each image and its mirror image")
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    if not args.checkpoint.is_file() or not args.data.exists():
        sys.exit(f"not found: {args.checkpoint if not args.checkpoint.is_file() else args.data}")
    saved = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
    state = saved["model"] if isinstance(saved, dict) and "model" in saved else saved
    img_size = args.img_size or (saved.get("config", {}).get("train", {}).get("img_size") if "model" in saved else None)
    if not img_size:
        sys.exit(f"{args.checkpoint} does not say its image size: give --img-size")
    images, labels, classes = read_test_set(args.data)
    model = torchvision.models.get_model(args.model, weights=None, num_classes=len(classes))
    model.load_state_dict(state, strict=True)
    acc = accuracy(model, images, labels, img_size, args.flip_tta, args.batch_size, torch.device(args.device))
    print(f"{args.checkpoint}: test accuracy {acc:.4f} on {len(images)} images ({args.model}, {img_size} px, "
          f"PIL Resize + ToTensor, float32{', flip TTA' if args.flip_tta else ''})")
    print(json.dumps({"checkpoint": str(args.checkpoint), "test_accuracy": acc, "test_images": len(images),
                      "model": args.model, "img_size": img_size, "flip_tta": args.flip_tta}))


if __name__ == "__main__":
    main()
