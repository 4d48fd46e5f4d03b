"""Which modules of src/fasttrain a `fasttrain <command>` process runs: the import closure of its
command's module, read from the source (every import statement, at module level or inside a function,
since a lazy import still runs when its branch does), so dvc.yaml's code deps can be checked against
it (tests/unit/test_dvc_deps.py) and each module's edit shown to make exactly those stages stale
(tests/integration/test_pipeline.py)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from fasttrain.cli import COMMANDS

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "fasttrain"
# What a process runs beyond its imports: parallel.py starts its ddp workers as `python -m fasttrain`
# (torchrun's --module, or srun), so they run __main__.py. tests/unit/test_dvc_deps.py checks the
# launch is still written that way.
LAUNCHES = {"fasttrain.parallel": {"fasttrain.__main__"}}


def module_file(name: str) -> Path:
    parts = name.split(".")[1:]
    path = PACKAGE.joinpath(*parts)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _is_module(name: str) -> bool:
    return name == "fasttrain" or module_file(name).is_file()


@functools.cache
def direct_imports(name: str) -> frozenset[str]:
    """The fasttrain modules that module `name` imports anywhere in its source."""
    path = module_file(name)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set(LAUNCHES.get(name, ()))
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            # `from fasttrain import train` imports the module train; `from fasttrain.x import f`, x
            targets = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names]
        else:
            continue
        for target in targets:
            if target == "fasttrain" or target.startswith("fasttrain."):
                # `import fasttrain.a.b` runs the package and every module on the way
                parts = target.split(".")
                found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if _is_module(".".join(parts[:i])))
    found.discard(name)
    return frozenset(found)


def closure(*entries: str) -> set[str]:
    seen: set[str] = set()
    todo = list(entries)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(direct_imports(name))
    return seen


def command_modules(command: str) -> set[str]:
    """Every fasttrain module that `fasttrain <command>` runs: the console script's cli.run, which
    imports the package first, then the command's module."""
    return closure("fasttrain", "fasttrain.cli", COMMANDS[command])


def command_files(command: str) -> set[str]:
    """command_modules as paths relative to the repository root, as dvc.yaml writes them."""
    root = PACKAGE.parents[1]
    return {module_file(name).relative_to(root).as_posix() for name in command_modules(command)}


def package_modules() -> list[str]:
    return sorted("fasttrain" if p.name == "__init__.py" else f"fasttrain.{p.stem}" for p in PACKAGE.glob("*.py"))
