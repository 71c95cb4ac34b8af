"""The shared realistic workloads (../shared/data beside the checkout), loaded
once per test session; tests that need them skip cleanly where they are absent."""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path
from typing import Any

import pytest
import zstandard

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@functools.cache
def _load(name: str) -> tuple[dict[str, Any], ...]:
    path = DATA_DIR / f"{name}.jsonl.zst"
    if not path.exists():
        pytest.skip(f"workload {name} not found beside the checkout ({path.name})")
    with path.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as reader:
        text = io.TextIOWrapper(reader, encoding="utf-8")
        return tuple(json.loads(line) for line in text if line.strip())


def gsm8k(n: int | None = None) -> list[dict[str, Any]]:
    """Eval episodes (fresh copies: a test may mutate them)."""
    records = _load("gsm8k-eval")
    return [json.loads(json.dumps(r)) for r in records[:n]]


def agentic(n: int | None = None) -> list[dict[str, Any]]:
    """Training episodes over 30 steps (10 per step)."""
    records = _load("agentic-train")
    return [json.loads(json.dumps(r)) for r in records[:n]]
