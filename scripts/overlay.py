"""Write params.yaml with an overlay laid over it: `python scripts/overlay.py BASE OVERLAY OUT [k=v ...]`,
or print the overlay as `dvc exp run` flags: `python scripts/overlay.py --dvc-flags OVERLAY`.

Used by `make demo` and `make fast` and the GPU scripts (all with fasttrain installed or on
PYTHONPATH), so that the repository's params.yaml is never edited in place. The overlay updates BASE
section by section, key by key; extra `section.key=value` arguments then override single keys
(values parsed as YAML). OUT is BASE's own text with those values put in: its comments, order and
layout kept, and a first line naming the keys laid over. OUT is written whole or not at all. Bad
input is one line on stderr and exit status 2, with OUT untouched.
"""

import os
import re
import sys
import textwrap
from pathlib import Path

import yaml

from fasttrain.atomic import atomic_write_text
from fasttrain.errors import FasttrainError

USAGE = ("usage: overlay.py BASE OVERLAY OUT [section.key=value ...]\n"
         "       overlay.py --dvc-flags OVERLAY")


class BadInput(Exception):
    pass


def read_sections(path: str) -> dict:
    """A params file: sections of keys (an empty file, such as /dev/null, has none)."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise BadInput(f"{path} is not YAML: {str(e).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise BadInput(f"{path} is not sections of keys (section: {{key: value}}), as params.yaml is")
    return data


def override(item: str) -> tuple[str, str, object]:
    key, eq, value = item.partition("=")
    section, dot, name = key.partition(".")
    if not (eq and dot and section and name):
        raise BadInput(f"bad override '{item}': use section.key=value, e.g. train.seed=1")
    try:
        return section, name, yaml.safe_load(value)
    except yaml.YAMLError:
        raise BadInput(f"bad override '{item}': its value is not YAML") from None


def laid_over(base: dict, base_path: str, layers: list[tuple[str, str, object]]) -> dict:
    for section, name, value in layers:
        if section not in base:
            raise BadInput(f"no section '{section}' in {base_path} (its sections: {', '.join(base)})")
        base[section][name] = value
    return base


def flow(value: object) -> str:
    """A value as one line of YAML: 0.01, null, synthetic, [0, 1]."""
    return yaml.safe_dump([value], default_flow_style=True, width=float("inf")).strip()[1:-1]


def edited_text(text: str, layers: list[tuple[str, str, object]], base_path: str, name: str) -> str:
    """`text` (BASE's) with each layer's value written over its key's, the key's comment kept and
    aligned as it was; a key BASE lacks goes after its section's last key. A first line names what
    was laid over, and by whom (`name`)."""
    lines = text.splitlines(keepends=True)
    for section, key, value in layers:
        start = next(i for i, line in enumerate(lines) if re.match(rf"{re.escape(section)}:(\s|$)", line))
        end = next((i for i in range(start + 1, len(lines)) if re.match(r"[^\s#]", lines[i])), len(lines))
        keys = [i for i in range(start + 1, end) if re.match(r"  [^\s#]", lines[i])]
        found = next((i for i in keys if re.match(rf"  {re.escape(key)}:(\s|$)", lines[i])), None)
        line = f"  {key}: {flow(value)}"
        if found is None:
            lines.insert((keys[-1] if keys else start) + 1, line + "\n")
            continue
        old = lines[found].rstrip("\n")
        comment = re.search(r"\s(#.*)$", old)  # (a value of params.yaml holds no " #")
        if comment:
            line = line.ljust(comment.start(1) - 1) + " " + comment.group(1)
        lines[found] = line + "\n"
    laid = ", ".join(dict.fromkeys(f"{s}.{k}" for s, k, _ in layers))
    head = textwrap.wrap(f"{base_path} with {name} laid over it: {laid}", 98, break_on_hyphens=False) if laid else []
    return "".join([f"# {line}\n" for line in head] + lines)


def laid_over_text(base_path: str, layers: list[tuple[str, str, object]], name: str, expected: dict) -> str:
    """edited_text, checked: it must read as `expected`. A BASE in a layout the edit does not know
    (flow style, say) is written plainly instead, without its comments, and the script says so."""
    try:
        text = edited_text(Path(base_path).read_text(), layers, base_path, name)
        if yaml.safe_load(text) == expected:
            return text
    except (StopIteration, yaml.YAMLError):
        pass
    print(f"overlay.py: {base_path}'s layout is not one key per line under its section: written without its "
          "comments", file=sys.stderr)
    return yaml.safe_dump(expected, sort_keys=False)


def write_whole(path: str, text: str) -> None:
    """fasttrain's atomic write (a reader never sees half a file); OUT's folder must exist."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise BadInput(f"cannot write {path}: No such file or directory")
    try:
        atomic_write_text(Path(path), text, "the params")
    except FasttrainError as e:  # a full disk or a refused permission, already one line
        raise BadInput(str(e)) from None


def main(argv: list[str]) -> None:
    if argv in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__.strip()}")
        return
    if argv[:1] == ["--dvc-flags"] and len(argv) == 2:
        overlay = read_sections(argv[1])
        print(" ".join(f"-S {section}.{key}={value}" for section, values in overlay.items()
                       for key, value in values.items()))
        return
    if len(argv) < 3 or any(a.startswith("-") for a in argv[:3]):
        raise BadInput(USAGE.replace("\n", " |"))
    base_path, overlay_path, out, *sets = argv
    base = read_sections(base_path)
    layers = [(s, k, v) for s, values in read_sections(overlay_path).items() for k, v in values.items()]
    layers += [override(item) for item in sets]
    expected = laid_over(base, base_path, layers)
    names = " and ".join(([overlay_path] if overlay_path != os.devnull else []) + (["the command line's values"] if sets else []))
    write_whole(out, laid_over_text(base_path, layers, names, expected))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BadInput as e:
        print(f"overlay.py: error: {e}", file=sys.stderr)
        sys.exit(2)
