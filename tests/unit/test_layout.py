"""The variant names and paths live in layout.py; dvc.yaml restates them where DVC cannot read Python.
A Layout of the seed "${item.seed}" gives the paths as dvc.yaml's matrix writes them."""

from pathlib import Path

import yaml

from fasttrain.layout import PARALLELS, PRECISION_NAMES, VARIANTS, Layout

DVC_YAML = yaml.safe_load((Path(__file__).resolve().parents[2] / "dvc.yaml").read_text())


def test_dvc_yaml_matrices_are_layouts_names():
    for stage in ("train", "evaluate"):
        matrix = DVC_YAML["stages"][stage]["matrix"]
        assert (tuple(matrix["parallel"]), tuple(matrix["precision"])) == (PARALLELS, PRECISION_NAMES)
        assert matrix["seed"] == "${compare.seeds}"  # a stage per variant and seed
        assert DVC_YAML["stages"][stage]["cmd"].endswith(" --seed ${item.seed}")


def test_compare_reads_and_the_plots_draw_every_variant_by_layouts_paths():
    """compare depends on the folders that hold every seed's records of every variant (and on nothing
    else there); the per-epoch charts draw the first seed's runs."""
    layout = Layout(Path(""), "${item.seed}")
    folders = list(dict.fromkeys(str(p(v).parent.parent) for v in VARIANTS for p in (
        layout.train_metrics, layout.eval_metrics, layout.train_diagnostics, layout.eval_diagnostics)))
    assert [d for d in DVC_YAML["stages"]["compare"]["deps"] if not d.startswith("src/")] == folders
    assert DVC_YAML["stages"]["compare"]["params"] == ["compare.seeds"]
    outs = {o if isinstance(o, str) else next(iter(o)) for stage in ("train", "evaluate") for kind in (
        "outs", "metrics", "plots") for o in DVC_YAML["stages"][stage].get(kind, [])}
    assert {o.split("/seed")[0] for o in outs if o.split("/seed")[0] in folders} == set(folders)
    first = Layout(Path(""), "${compare.seeds[0]}")
    for plot in DVC_YAML["plots"]:
        (spec,) = plot.values()
        if str(layout.compare_plot) not in spec["y"]:
            assert list(spec["y"]) == [str(first.train_plot(v)) for v in VARIANTS]


def test_each_stage_writes_its_records_at_layouts_paths():
    """Headline figures as DVC metrics, the rest of each record an output that is not one."""
    layout, item = Layout(Path(""), "${item.seed}"), "${item.parallel}-${item.precision}"
    for stage, metrics, diagnostics in (("train", layout.train_metrics, layout.train_diagnostics),
                                        ("evaluate", layout.eval_metrics, layout.eval_diagnostics)):
        spec = DVC_YAML["stages"][stage]
        assert spec["metrics"] == [str(metrics(item))]
        assert str(diagnostics(item)) in spec["outs"]
