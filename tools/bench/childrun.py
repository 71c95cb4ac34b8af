"""A benchmark's measuring child, run with one checkout's package first.

Benchmarks that compare trees run their own script again as a child
(``--child``) with the tree's package first on ``PYTHONPATH`` and this
folder after it; the child prints one JSON object as its last line. Nothing
here imports the package. ``benchlib`` does, and puts first the tree named
by ``PRIMERUNS_BENCH_TREE`` (set here), else its own checkout: a child
imports only the tree it was given. A child's object may name the package
it imported (``package``: ``primeruns.__file__``), and is then refused if
that is not the tree's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def child_json(script: str, tree: Path, args: Sequence[str], what: str) -> dict[str, Any]:
    """Run ``script`` with ``args`` and ``tree``'s package first; the JSON
    object its last line prints. RuntimeError naming ``what`` if it fails."""
    done = subprocess.run(
        [sys.executable, str(Path(script).resolve()), *args],
        env={
            **os.environ,
            "PYTHONPATH": f"{tree}{os.pathsep}{HERE}",
            "PRIMERUNS_BENCH_TREE": str(tree),  # benchlib puts this tree first, not its own
        },
        capture_output=True,
        text=True,
        check=False,
        cwd=tree,  # the tree's own package first, whatever else the child puts first
    )
    if done.returncode:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    # A child that names the package it imported proves it measured the tree.
    package = result.get("package")
    if package is not None and not Path(package).resolve().is_relative_to(Path(tree).resolve()):
        raise RuntimeError(f"{what} measured {package}, not the package of {tree}")
    return result
