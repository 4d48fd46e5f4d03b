"""The `fasttrain` command: one subcommand per pipeline stage, each imported only when it runs
(`compare` and `--help` need no torch)."""

from __future__ import annotations

import gc
import importlib
import os
import sys
from pathlib import Path

import click

from fasttrain import __version__, server
from fasttrain.errors import FasttrainError, Preempted
from fasttrain.layout import user_cache

COMMANDS = {  # name -> module whose `main` is the click command
    "download": "fasttrain.download",
    "train": "fasttrain.train",
    "evaluate": "fasttrain.evaluate",
    "compare": "fasttrain.compare",
    "bench": "fasttrain.bench",
    "experiments": "fasttrain.experiments",
    "serve": "fasttrain.server",
}
SUMMARIES = {
    "download": "Fetch or read CIFAR-10 (or make the synthetic set) into data/dataset.pt.",
    "train": "Train one precision x parallel variant.",
    "evaluate": "Evaluate one variant's final model on the test set.",
    "compare": "Compare every variant against single-fp32.",
    "bench": "Time the loaders against the compute ceiling and the bf16 peak.",
    "experiments": "The DVC experiments in 120 columns: what each changed and its figures.",
    "serve": "Run a command (dvc repro) whose fasttrain processes fork from one warm process.",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        return importlib.import_module(COMMANDS[name]).main

    def format_commands(self, ctx, formatter):
        with formatter.section("Commands"):
            formatter.write_dl(list(SUMMARIES.items()))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fasttrain")
def cli() -> None:
    """Which training speed-up is worth it on your GPU? Train, evaluate and compare every
    precision x parallel variant of one recipe. Stages read params.yaml; `dvc repro` runs them all."""


def main(argv: list[str] | None = None) -> None:
    """Every user error ends as one line on stderr and a non-zero exit, never a traceback; a run
    stopped by SIGTERM/SIGUSR1 after its checkpoint exits 75 (EX_TEMPFAIL: requeue it)."""
    try:
        cli.main(args=argv, prog_name="fasttrain", standalone_mode=False)
    except FasttrainError as e:
        click.echo(f"fasttrain: {'stopped' if isinstance(e, Preempted) else 'error'}: {e}", err=True)
        sys.exit(e.exit_status)
    except click.exceptions.Abort:
        click.echo("fasttrain: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        click.echo(f"fasttrain: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("fasttrain: interrupted", err=True)
        sys.exit(130)


def run() -> None:
    """The console script and `python -m fasttrain`: main(), then the interpreter's own exit, every
    step of it (threads joined, every atexit handler run, output flushed, the teardown), with the
    objects the command made frozen out of the garbage collector first (gc.freeze). The teardown's
    collections then skip them: with torch loaded they are millions, and walking them made the exit
    of an AlexNet process 1.1-1.9 s on a 2-core CPU, where frozen it took 0.35-0.41 s
    (docs/outputs.md). An exception main() does not catch (a bug) ends as usual, with its traceback.

    Under `fasttrain serve` ($FASTTRAIN_SERVER set) the command runs in a child of the server, already
    imported, and this process only relays it (server.forward); in that child, `serve` raises Forked
    out of its loop and the command runs here. Its exit status reaches the served process once the
    last atexit handler has run, ahead of the teardown (server.finished, server._report_done)."""
    status = server.forward(sys.argv[1:])
    if status is not None:
        server.exit_with(status)
    cache_bytecode()
    try:
        try:
            main()
            return
        except server.Forked as child:  # this process is the served command from here on
            argv = child.argv
        try:
            main(argv)
        except SystemExit as e:
            server.finished(e.code)
            raise
        server.finished(0)
    finally:
        gc.freeze()


BYTECODE_CACHE = "FASTTRAIN_BYTECODE_CACHE"  # a folder, or "off"; default $XDG_CACHE_HOME/fasttrain/bytecode


def cache_bytecode() -> None:
    """Where torch's modules have no cached bytecode and Python will not write it (PYTHONDONTWRITEBYTECODE,
    as many container images set, or a read-only site-packages), every process compiles torch from
    source again: 5-9 s of each stage's start-up on an H200 host (scripts/time_to_answer.py). Then
    this process keeps its bytecode in a cache folder of its own instead (sys.pycache_prefix, Python's
    PYTHONPYCACHEPREFIX), outside the source tree, and later processes read it from there. An
    interpreter that has torch's bytecode, or a PYTHONPYCACHEPREFIX of its own, is left as it is;
    FASTTRAIN_BYTECODE_CACHE names another folder, or turns it off."""
    import importlib.util

    choice = os.environ.get(BYTECODE_CACHE, "")
    if choice == "off" or sys.pycache_prefix is not None:
        return
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return
    cached = Path(importlib.util.cache_from_source(spec.origin))
    writable = os.access(cached.parent if cached.parent.is_dir() else cached.parents[1], os.W_OK)
    if cached.is_file() or (writable and not sys.dont_write_bytecode):
        return
    sys.pycache_prefix = str(Path(choice).resolve() if choice else user_cache("bytecode"))
    sys.dont_write_bytecode = False
