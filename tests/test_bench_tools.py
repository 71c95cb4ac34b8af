"""tools/bench/benchlib.py: what the benchmarks say about the machine they ran
on, so that a figure missing its target is read against what the machine
allowed (issue #32: a sync's rate is its CPU per row on the cores it gets)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "tools" / "bench"


def _benchlib() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("benchlib", BENCH / "benchlib.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["benchlib"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_the_ceiling_names_what_binds_and_what_the_target_needs() -> None:
    benchlib = _benchlib()
    # One core's worth between the sync and the platform: their sum binds.
    note = benchlib.ceiling_note(1.0, 0.95, 0.5, 2000.0)
    assert "about 690 rows/s at most" in note and "1.00 cores' worth for both" in note
    assert "needs ≤ 0.50 ms/row together and ≤ 0.50 each (MISS)" in note
    # Two cores' worth: the sync's one interpreter binds first.
    note = benchlib.ceiling_note(2.0, 1.12, 0.55, 2000.0)
    assert "about 893 rows/s at most" in note and "the sync's interpreter" in note
    # Within reach only when both sides are cheap enough.
    assert "(ok)" in benchlib.ceiling_note(2.0, 0.45, 0.4, 2000.0)


def test_the_cores_probe_counts_the_cpu_its_busy_processes_got() -> None:
    cores = _benchlib().parallel_cores(0.2)
    # Whatever the host gives (a shared one: less than nproc), never more.
    assert 0.0 < cores <= (os.cpu_count() or 1) * 1.2
