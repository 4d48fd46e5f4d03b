"""Write params.yaml with an overlay laid over it: `python scripts/overlay.py BASE OVERLAY OUT [k=v ...]`,
or print the overlay as `dvc exp run` flags: `python scripts/overlay.py --dvc-flags OVERLAY`.

Used by `make demo` and `make fast` and the GPU scripts (all with fasttrain installed or on
PYTHONPATH), so that the repository's params.yaml is never edited in place. The overlay updates BASE
section by section, key by key; extra `section.key=value` arguments then override single keys
(values parsed as YAML). OUT is written whole or not at all. Bad input is one line on stderr and
exit status 2, with OUT untouched.
"""

import os
import sys
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


def write_whole(path: str, params: dict) -> None:
    """fasttrain's atomic write (a reader never sees half a file); OUT's folder must exist."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise BadInput(f"cannot write {path}: No such file or directory")
    try:
        atomic_write_text(Path(path), yaml.safe_dump(params, sort_keys=False), "the params")
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
    write_whole(out, laid_over(base, base_path, layers + [override(item) for item in sets]))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BadInput as e:
        print(f"overlay.py: error: {e}", file=sys.stderr)
        sys.exit(2)
