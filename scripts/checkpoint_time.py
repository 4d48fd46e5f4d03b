"""Seconds to save one training checkpoint of AlexNet (weights + AdamW state, 685 MB) as `train`
writes it, streamed into the file, against the alternative: the whole file in memory, then written.

    python scripts/checkpoint_time.py [DIR] [--rounds N]

DIR (default: a temporary folder) is where the files go: put it on the disk training writes to.
The two ways take turns, N rounds (default 4); each prints its median.
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torchvision

from fasttrain import atomic, checkpoint


def buffered(obj, path: Path) -> None:  # the alternative: the whole file in memory, then written
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic.atomic_write_bytes(path, buf.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    model = torchvision.models.alexnet(num_classes=10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, 3, 227, 227)).sum().backward()
    optimizer.step()  # AdamW's two moment buffers now exist
    obj = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = Path(d) / "last.pt"
        ways = {"streamed (checkpoint.save)": checkpoint.save, "buffered in memory": buffered}
        seconds = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, save in ways.items():
                start = time.perf_counter()
                save(obj, path)
                seconds[name].append(time.perf_counter() - start)
        size = path.stat().st_size / 1e6
    for name, s in seconds.items():
        print(f"{name}: median {statistics.median(s):.2f} s for {size:.0f} MB ({', '.join(f'{x:.2f}' for x in s)})")


if __name__ == "__main__":
    main()
