"""The README and the docs link only to files that exist: a renamed results folder or document
breaks a test, not a reader's click."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "scripts").rglob("*.md")])
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")  # [text](target) and ![alt](target), anchors dropped


def links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]


def test_the_link_pattern_finds_relative_links_and_skips_web_ones():
    text = "see [a](docs/a.md), ![p](img/p.png), [b](b.md#part), [web](https://x.org/a.md)"
    assert links(text) == ["docs/a.md", "img/p.png", "b.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_in_the_repository(doc):
    missing = [t for t in links(doc.read_text()) if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links to missing files: {missing}"


# --- what the docs say against what the code does, where a check can tell ---------------------------

CURRENT = [d for d in DOCS if "results" not in d.relative_to(ROOT).parts]  # results/: records of their day
PARAM = re.compile(r"(?:`|-S )((?:data|model|train|evaluate|run)\.[a-z_0-9]+)")


@pytest.mark.parametrize("doc", CURRENT, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_param_a_doc_names_is_a_key_of_params_yaml(doc):
    import dataclasses

    from fasttrain import config

    keys = {f"{s.name}.{f.name}" for s in dataclasses.fields(config.Params) for f in dataclasses.fields(s.default_factory)}
    unknown = sorted(set(PARAM.findall(doc.read_text())) - keys - set(config.REMOVED))  # removed: their evidence
    assert not unknown, f"{doc.relative_to(ROOT)} names params that do not exist (moved or gone): {unknown}"


def _dvc_outputs() -> dict[str, bool]:
    """dvc.yaml's stage outputs, metrics and plots, variant paths as seed<N>/<variant>: path -> cached by DVC."""
    import yaml

    found = {}
    for stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind, []):
                path, spec = next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
                found[path.replace("${item.parallel}-${item.precision}", "<variant>").replace("${item.seed}", "<N>")] = (spec or {}).get("cache", True)
    return found


def test_outputs_md_says_which_outputs_dvc_caches_as_dvc_yaml_does():
    outputs, rows = _dvc_outputs(), 0
    for line in (ROOT / "docs" / "outputs.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not line.startswith("| `") or len(cells) != 3:
            continue
        for path in re.findall(r"`([^`]+)`", cells[0]):
            path = path.replace("<parallel>-<precision>", "<variant>").rstrip("/")
            if path in outputs:
                rows += 1
                cached = "DVC's cache" in cells[2] or "in DVC's cache" in cells[2]
                assert cached == outputs[path], f"docs/outputs.md on {path}: '{cells[2]}', dvc.yaml cache: {outputs[path]}"
            else:
                assert "DVC" not in cells[2], f"docs/outputs.md: {path} is no DVC output, yet '{cells[2]}'"
    assert rows == len(outputs), f"docs/outputs.md's table names {rows} of dvc.yaml's {len(outputs)} outputs"


def test_the_plots_page_draws_offline_as_the_docs_say():
    """.dvc/config points DVC at a page template that loads nothing from the network."""
    assert "html_template = plots/page.html" in (ROOT / ".dvc" / "config").read_text()
    page = (ROOT / ".dvc" / "plots" / "page.html").read_text()
    assert not re.search(r"<script[^>]+src=", page) and "{plot_divs}" in page
    for doc in CURRENT:
        assert "loads vega from" not in doc.read_text(), doc


def test_architecture_md_lists_every_module_on_a_floor_it_keeps():
    """docs/architecture.md's table: each module of src/fasttrain in one row, and no module imports
    (at run time; annotations under TYPE_CHECKING aside) from a row below its own."""
    import ast

    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = [re.findall(r"`(\w+)`", line.split("|")[1]) for line in text.splitlines()
            if line.startswith("| `")]
    floor = {m: i for i, names in enumerate(rows) for m in names}
    src = ROOT / "src" / "fasttrain"
    modules = {p.stem for p in src.glob("*.py")} - {"__init__", "__main__"}
    assert sorted(floor) == sorted(modules) and sum(map(len, rows)) == len(modules)
    upward = []
    for path in sorted(src.glob("*.py")):
        if path.stem not in floor:
            continue
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and getattr(block.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            names = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fasttrain"):
                names = [a.name for a in node.names] if node.module == "fasttrain" else [node.module.split(".")[1]]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1] for a in node.names if a.name.startswith("fasttrain.")]
            upward += [f"{path.stem} -> {n}" for n in names if floor.get(n, -1) > floor[path.stem]]
    assert upward == []
