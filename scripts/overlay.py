"""Write params.yaml with an overlay laid over it: `python scripts/overlay.py BASE OVERLAY OUT [k=v ...]`,
or print the overlay as `dvc exp run` flags: `python scripts/overlay.py --dvc-flags OVERLAY`.

Used by `make demo` and `make fast` and the GPU scripts, so that the repository's params.yaml is never
edited in place. Extra `section.key=value` arguments override single keys (values parsed as YAML).
"""

import sys

import yaml

if sys.argv[1] == "--dvc-flags":
    overlay = yaml.safe_load(open(sys.argv[2])) or {}
    print(" ".join(f"-S {section}.{key}={value}" for section, values in overlay.items()
                   for key, value in values.items()))
    sys.exit(0)

base, overlay, out, *sets = sys.argv[1:]
params = yaml.safe_load(open(base))
for section, values in (yaml.safe_load(open(overlay)) or {}).items():
    params[section].update(values)
for item in sets:
    key, value = item.split("=", 1)
    section, name = key.split(".", 1)
    params[section][name] = yaml.safe_load(value)
with open(out, "w") as f:
    yaml.safe_dump(params, f, sort_keys=False)
