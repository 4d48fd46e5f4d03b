"""The download stage: ingest `data.source` into the one prepared form every later stage reads."""

from __future__ import annotations

import click

from fasttrain import config
from fasttrain.data import prepare
from fasttrain.layout import Layout


@click.command("download")
@click.option("--params", "params_path", default="params.yaml", show_default=True,
              type=click.Path(dir_okay=False), help="The params file to read (its data: section).")
def main(params_path: str) -> None:
    """Fetch or read CIFAR-10 (or make the synthetic set) per `data.source`; writes data/dataset.pt."""
    d = config.load(params_path).data
    layout = Layout()
    ds = prepare(d.source, layout.dataset, layout.raw_dir, md5=d.md5,
                 synthetic_train_size=d.synthetic_train_size, synthetic_test_size=d.synthetic_test_size,
                 synthetic_image_size=d.synthetic_image_size, seed=d.synthetic_seed)
    click.echo(f"{layout.dataset}: {len(ds.train_labels)} train + {len(ds.test_labels)} test images, "
               f"{ds.train_images.shape[-1]}x{ds.train_images.shape[-2]} px, {len(ds.classes)} classes "
               f"from {ds.source}")
