"""A benchmark's measuring child, run with one checkout's package first.

Benchmarks that compare trees run their own script again as a child
(``--child``) with the tree's package first on ``PYTHONPATH`` and this
folder after it; the child prints one JSON object as its last line. Nothing
here imports the package (``benchlib`` does, and puts its own checkout
first): a child imports only the tree it was given.
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
        env={**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{HERE}"},
        capture_output=True,
        text=True,
        check=False,
        cwd=tree,  # the tree's own package first, whatever else the child puts first
    )
    if done.returncode:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
