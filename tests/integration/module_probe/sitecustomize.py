"""Test hook, put on PYTHONPATH by test_imports.py: every Python process that starts with
$FASTTRAIN_TEST_MODULES set writes, as it exits, the names of the modules it imported to
$FASTTRAIN_TEST_MODULES/<pid>.txt (fasttrain's own exit runs the atexit handlers too, cli.run)."""

import atexit
import os
import sys

FOLDER = os.environ.get("FASTTRAIN_TEST_MODULES")


def _write() -> None:
    with open(os.path.join(FOLDER, f"{os.getpid()}.txt"), "w") as f:
        f.write("\n".join([" ".join(sys.argv), *sorted(sys.modules)]))


if FOLDER:
    atexit.register(_write)
