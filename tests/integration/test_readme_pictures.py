"""scripts/readme_pictures.py draws every top-level chart of `dvc plots show` to a PNG, with every variant in it.

The run is fabricated as in test_plots.py (seconds, not minutes). Skipped without vl-convert (the `docs` extra).
"""

import importlib.util
import struct
import sys

import pytest

from scratch import REPO, run
from test_plots import BARS, CURVES, fabricate_run, variants_in

from fasttrain.layout import VARIANTS

pytestmark = pytest.mark.slow
vl_convert = pytest.importorskip("vl_convert")

SCRIPT = REPO / "scripts" / "readme_pictures.py"


def load_script():
    spec = importlib.util.spec_from_file_location("readme_pictures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


def test_every_top_level_plot_becomes_a_png_with_every_variant(tiny_repo, tmp_path):
    fabricate_run(tiny_repo, seed=0)
    out = tmp_path / "pictures"
    printed = run([sys.executable, str(SCRIPT), str(tiny_repo), str(out)], REPO).stdout.split()

    plots = [*CURVES, *BARS]
    assert sorted(printed) == sorted(str(out / f"{p}.png") for p in plots)
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{p}.png" for p in plots)  # no temporary files left
    for plot_id in plots:
        width, height = png_size((out / f"{plot_id}.png").read_bytes())
        assert width >= 600 and height >= 400, (plot_id, width, height)  # a 300x300 chart at scale 2, axes and legend

    # The pictures are of DVC's own specs: every variant in the data, and its labels drawn.
    script = load_script()
    specs = script.vega_lite_specs(tiny_repo, plots)
    for plot_id in CURVES:
        assert variants_in(specs[plot_id], "filename") == set(VARIANTS), plot_id
        svg = vl_convert.vegalite_to_svg(specs[plot_id])
        for label in ["fp32", "autocast", "amp", "bf16", "single", "dp", "ddp", specs[plot_id]["title"]["text"],
                      specs[plot_id]["encoding"]["y"]["title"]]:
            assert f">{label}<" in svg, (plot_id, label)
    for plot_id in BARS:
        assert variants_in(specs[plot_id], "variant") == set(VARIANTS), plot_id
        svg = vl_convert.vegalite_to_svg(specs[plot_id])
        for label in VARIANTS:
            assert f">{label}<" in svg, (plot_id, label)


def test_a_workspace_without_the_run_fails_in_one_line_and_writes_nothing(tiny_repo, tmp_path):
    out = tmp_path / "pictures"
    proc = run([sys.executable, str(SCRIPT), str(tiny_repo), str(out)], REPO, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("readme_pictures: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert not out.exists()


def test_partial_draws_a_stopped_runs_curves_and_names_what_is_missing(tiny_repo, tmp_path):
    """A run stopped after some variants (by a time limit, say): --partial draws what it made."""
    fabricate_run(tiny_repo, seed=0)
    made = [v for v in VARIANTS if v.startswith("single-")]
    for variant in VARIANTS:
        if variant not in made:
            (tiny_repo / "plots" / "train" / "seed0" / f"{variant}.csv").unlink()
    out = tmp_path / "pictures"
    args = [sys.executable, str(SCRIPT), str(tiny_repo), str(out), "--plot", "test_accuracy_by_epoch"]

    refused = run(args, REPO, check=False)  # without --partial: an error, nothing written
    assert refused.returncode == 1 and "8 plot file(s) missing" in refused.stderr, refused.stderr
    assert not out.exists()

    drawn = run([*args, "--partial"], REPO)
    assert drawn.stdout.split() == [str(out / "test_accuracy_by_epoch.png")]
    assert "8 plot file(s) missing, drawn without them: plots/train/seed0/ddp-amp.csv" in drawn.stderr
    png_size((out / "test_accuracy_by_epoch.png").read_bytes())
    spec = load_script().vega_lite_specs(tiny_repo, ["test_accuracy_by_epoch"], partial=True)
    assert variants_in(spec["test_accuracy_by_epoch"], "filename") == set(made)


def test_a_full_disk_is_one_line_and_the_old_picture_stays_whole(tiny_repo, tmp_path, monkeypatch, capsys):
    """The picture goes through fasttrain's atomic write: a disk that fills while it is written leaves
    the picture drawn before, no temporary file, and one line naming the file and the free space."""
    import errno
    import os

    from fasttrain import atomic

    fabricate_run(tiny_repo, seed=0)
    out = tmp_path / "pictures"
    out.mkdir()
    old = out / "test_accuracy_by_epoch.png"
    old.write_bytes(b"the picture drawn before")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    script = load_script()
    assert script.main([str(tiny_repo), str(out), "--plot", "test_accuracy_by_epoch"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"readme_pictures: error: could not write a picture to {old}: No space left on device")
    assert err.count("\n") == 1 and "free" in err, err
    assert old.read_bytes() == b"the picture drawn before"
    assert sorted(p.name for p in out.iterdir()) == [old.name]  # no temporary file left
