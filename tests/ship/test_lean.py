"""What a shipping process leaves unloaded (``ship.lean``): pyarrow without numpy.

What a user depends on: a training run's uplink, and ``primeruns sync`` or
``replay`` run as the command, do not load numpy where the pyarrow
installed goes without it (~65 ms of CPU of every such process's pyarrow
import), and make the very same Parquet objects; where pyarrow needs numpy
(before 18), or its version cannot be told, numpy is left alone, so the
sample table is never turned off for it; a caller handing the command its
arguments (a test's process, which may import numpy later) keeps it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
import workloads

import primeruns as pr
from primeruns.projection import episodes_to_parquet_bytes
from primeruns.ship import lean

_CREATED_AT = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)

# A shipping process's start (the uplink's ``__main__``: its module's top
# runs, then argparse exits), then one step's object of the episodes given.
_OBJECT = """
import hashlib, json, runpy, sys
from datetime import datetime
import orjson
sys.argv = ["primeruns-uplink", "--help"]
try:
    runpy.run_module("primeruns.ship.uplink_main", run_name="__main__")
except SystemExit:
    pass
from primeruns.projection import episodes_to_parquet_bytes
episodes = orjson.loads(sys.stdin.buffer.read())
blob = episodes_to_parquet_bytes(
    episodes, "rft-1", 10, created_at=datetime.fromisoformat(CREATED_AT)
)
print(json.dumps([hashlib.sha256(blob).hexdigest(), sys.modules.get("numpy", 0) is None]))
"""

# The command run as a program (its arguments this process's own), or
# called with them: whether numpy is then marked absent.
_COMMAND = """
import json, sys
from primeruns import cli
sys.argv = ["primeruns", *ARGS]
if AS_PROGRAM:
    cli.main()
else:
    cli.main(ARGS)
print(json.dumps(sys.modules.get("numpy", 0) is None))
"""


def _run(code: str, stdin: bytes = b"") -> Any:
    out = subprocess.run(
        [sys.executable, "-P", "-c", code],
        input=stdin,
        capture_output=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(pr.__file__).resolve().parents[1])},
    )
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def test_the_uplink_makes_the_same_parquet_objects_without_loading_numpy() -> None:
    episodes = workloads.agentic(3)
    digest, absent = _run(
        _OBJECT.replace("CREATED_AT", repr(_CREATED_AT.isoformat())), orjson.dumps(episodes)
    )
    assert absent  # pyarrow 26 here: it goes without numpy
    here = episodes_to_parquet_bytes(episodes, "rft-1", 10, created_at=_CREATED_AT)
    assert here is not None and digest == hashlib.sha256(here).hexdigest()


@pytest.mark.parametrize(("as_program", "absent"), [(True, True), (False, False)])
def test_sync_run_as_the_command_leaves_numpy_unloaded(
    tmp_path: Path, as_program: bool, absent: bool
) -> None:
    args = ["sync", "--dry-run", str(tmp_path / "no-such-run")]
    code = _COMMAND.replace("ARGS", repr(args)).replace("AS_PROGRAM", repr(as_program))
    assert _run(code) is absent


@pytest.mark.parametrize(
    ("version_file", "needs"),
    [
        ("__version__ = version = '15.0.2'\n", True),
        ("__version__ = version = '17.0.0'\n", True),
        ("__version__ = version = '18.0.0'\n", False),
        ("__version__ = version = '26.0.1'\n", False),
        ("something else\n", True),  # not told: numpy is left alone
        (None, True),
    ],
)
def test_numpy_is_left_to_a_pyarrow_that_needs_it_or_cannot_tell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version_file: str | None, needs: bool
) -> None:
    folder = tmp_path / "pyarrow"
    folder.mkdir()
    if version_file is not None:
        (folder / "_generated_version.py").write_text(version_file)
    spec = SimpleNamespace(submodule_search_locations=[str(folder)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    assert lean.pyarrow_needs_numpy() is needs


def test_without_pyarrow_numpy_is_not_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert lean.pyarrow_needs_numpy() is False
