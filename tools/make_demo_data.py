"""Build ``primeruns/demo_data/``: the small bundled workload ``primeruns demo`` runs.

Taken from the shared realistic data beside the checkout (``../shared/data``):
the first 30 gsm8k evaluation episodes, and the three smallest agentic training
episodes of each of the first 4 steps, so the demo shows real records while
the package stays well under 1 MB. Written as zstd-compressed JSONL, the same
format as the shared data. Re-run it only when the shared data changes::

    python tools/make_demo_data.py
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import zstandard

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
OUT = ROOT / "primeruns" / "demo_data"
EVAL_EPISODES = 30
TRAIN_STEPS = 4
PER_STEP = 3


def _read(name: str) -> list[dict[str, Any]]:
    with (SHARED / name).open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as r:
        return [json.loads(line) for line in io.TextIOWrapper(r, encoding="utf-8") if line.strip()]


def _write(name: str, records: list[dict[str, Any]]) -> int:
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
    data = zstandard.ZstdCompressor(level=19).compress(text)
    (OUT / name).write_bytes(data)
    return len(data)


def _step(record: dict[str, Any]) -> int:
    return int(record["run"]["work"]["step"])


def main() -> None:
    OUT.mkdir(exist_ok=True)
    evals = _read("gsm8k-eval.jsonl.zst")[:EVAL_EPISODES]
    train = _read("agentic-train.jsonl.zst")
    chosen: list[dict[str, Any]] = []
    for step in range(TRAIN_STEPS):
        at_step = [r for r in train if _step(r) == step]
        at_step.sort(key=lambda r: len(json.dumps(r)))
        chosen.extend(at_step[:PER_STEP])
    sizes = (_write("gsm8k-eval.jsonl.zst", evals), _write("agentic-train.jsonl.zst", chosen))
    print(f"wrote {len(evals)} eval and {len(chosen)} train episodes: {sum(sizes)} bytes")


if __name__ == "__main__":
    main()
