"""The realistic workloads the tests log: real verifiers 0.4.0 episodes, bundled in
the repository (``tests/data/workloads/``, built by ``tools/make_bundled_data.py``)
so that a fresh clone needs nothing beside it.

The bundle is small (300 gsm8k evaluation episodes; 3 agentic training episodes
for each of 30 steps). A test that needs more gets copies with renewed ids:
the same content as new episodes, which every sink must store anew.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import zstandard

DATA_DIR = Path(__file__).resolve().parent / "data" / "workloads"


@functools.cache
def _load(name: str) -> tuple[bytes, ...]:
    path = DATA_DIR / f"{name}.jsonl.zst"
    with path.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as reader:
        return tuple(line for line in io.BufferedReader(reader).read().splitlines() if line)


def renew_ids(record: dict[str, Any], copy: int) -> dict[str, Any]:
    """Give ``record`` (in place) and its traces ids of the same shape, derived
    from the originals and ``copy`` (0 keeps them as they are)."""
    if copy == 0:
        return record

    def derive(value: Any) -> str:
        return hashlib.md5(f"{value}/{copy}".encode()).hexdigest()

    record["id"] = derive(record.get("id"))
    for trace in record.get("traces") or []:
        if isinstance(trace, dict) and "id" in trace:
            trace["id"] = derive(trace["id"])
    return record


def _cycle(lines: tuple[bytes, ...], n: int) -> list[dict[str, Any]]:
    return [renew_ids(json.loads(lines[i % len(lines)]), i // len(lines)) for i in range(n)]


def gsm8k(n: int | None = None) -> list[dict[str, Any]]:
    """``n`` evaluation episodes (fresh copies: a test may mutate them); past
    the bundled 300 the same episodes repeat with renewed ids."""
    lines = _load("gsm8k-eval")
    return _cycle(lines, len(lines) if n is None else n)


def agentic(n: int | None = None) -> list[dict[str, Any]]:
    """Training episodes, three per step over steps 0-29, in step order."""
    lines = _load("agentic-train")
    return _cycle(lines, len(lines) if n is None else n)


def agentic_by_step(per_step: int) -> dict[int, list[dict[str, Any]]]:
    """``per_step`` training episodes for each of the 30 steps (the bundled
    three of a step repeat with renewed ids when more are asked for)."""
    stored: dict[int, list[bytes]] = defaultdict(list)
    for line in _load("agentic-train"):
        stored[int(json.loads(line)["run"]["work"]["step"])].append(line)
    return {step: _cycle(tuple(lines), per_step) for step, lines in sorted(stored.items())}
