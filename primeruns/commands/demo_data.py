"""The bundled demo workload (``primeruns/demo_data``, built by
``tools/make_bundled_data.py``): real gsm8k eval and agentic training episodes."""

from __future__ import annotations

import io
import json
from importlib import resources
from typing import Any

import zstandard

__all__ = ["eval_episodes", "train_episodes"]


def _load(name: str) -> list[dict[str, Any]]:
    data = resources.files("primeruns").joinpath("demo_data", name).read_bytes()
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
        text = io.TextIOWrapper(reader, encoding="utf-8")
        return [json.loads(line) for line in text if line.strip()]


def eval_episodes() -> list[dict[str, Any]]:
    """30 gsm8k evaluation episodes."""
    return _load("gsm8k-eval.jsonl.zst")


def train_episodes() -> dict[int, list[dict[str, Any]]]:
    """Agentic training episodes by step (4 steps of 3)."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for record in _load("agentic-train.jsonl.zst"):
        by_step.setdefault(int(record["run"]["work"]["step"]), []).append(record)
    return dict(sorted(by_step.items()))
