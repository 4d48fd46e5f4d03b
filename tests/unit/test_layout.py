"""The variant names live in layout.py; dvc.yaml restates them where DVC cannot read Python."""

from pathlib import Path

import yaml

from fasttrain.layout import PARALLELS, PRECISION_NAMES, VARIANTS, Layout

DVC_YAML = yaml.safe_load((Path(__file__).resolve().parents[2] / "dvc.yaml").read_text())


def test_dvc_yaml_matrices_are_layouts_names():
    for stage in ("train", "evaluate"):
        matrix = DVC_YAML["stages"][stage]["matrix"]
        assert (tuple(matrix["parallel"]), tuple(matrix["precision"])) == (PARALLELS, PRECISION_NAMES)


def test_compare_reads_and_the_plots_draw_every_variant_by_layouts_paths():
    layout = Layout(Path(""))
    expected = [str(p(v)) for v in VARIANTS for p in (layout.train_metrics, layout.eval_metrics,
                                                        layout.train_diagnostics, layout.eval_diagnostics)]
    assert [d for d in DVC_YAML["stages"]["compare"]["deps"] if not d.startswith("src/")] == expected
    for plot in DVC_YAML["plots"]:
        (spec,) = plot.values()
        if str(layout.compare_plot) not in spec["y"]:
            assert list(spec["y"]) == [str(layout.train_plot(v)) for v in VARIANTS]


def test_each_stage_writes_its_records_at_layouts_paths():
    """Headline figures as DVC metrics, the rest of each record an output that is not one."""
    layout, item = Layout(Path("")), "${item.parallel}-${item.precision}"
    for stage, metrics, diagnostics in (("train", layout.train_metrics, layout.train_diagnostics),
                                        ("evaluate", layout.eval_metrics, layout.eval_diagnostics)):
        spec = DVC_YAML["stages"][stage]
        assert spec["metrics"] == [str(metrics(item))]
        assert str(diagnostics(item)) in spec["outs"]
