"""Build the small workloads bundled in the repository from the larger shared ones.

Two destinations, both zstd-compressed JSONL in the shared data's format, taken
from ``../shared/data`` beside the checkout (which only benchmarks read):

* ``primeruns/demo_data/`` (shipped in the package, for ``primeruns demo``):
  the first 30 gsm8k evaluation episodes and the three smallest agentic
  training episodes of each of the first 4 steps, so the wheel stays small.
* ``tests/data/workloads/`` (for the test suite, which never reads outside the
  repository): the first 300 gsm8k episodes and the three smallest agentic
  episodes of each of the 30 training steps, a few hundred KB in all.
  ``tests/workloads.py`` gives larger counts by renewing ids.

Re-run it only when the shared data changes::

    python tools/make_bundled_data.py
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import zstandard

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
# (directory, eval episodes, training steps, episodes per step)
TARGETS = (
    (ROOT / "primeruns" / "demo_data", 30, 4, 3),
    (ROOT / "tests" / "data" / "workloads", 300, 30, 3),
)


def _read(name: str) -> list[dict[str, Any]]:
    path = SHARED / name
    if not path.exists():
        raise SystemExit(f"{path.name} not found under {SHARED}: this needs ../shared/data")
    with path.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as r:
        return [json.loads(line) for line in io.TextIOWrapper(r, encoding="utf-8") if line.strip()]


def _write(path: Path, records: list[dict[str, Any]]) -> int:
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
    data = zstandard.ZstdCompressor(level=19).compress(text)
    path.write_bytes(data)
    return len(data)


def _step(record: dict[str, Any]) -> int:
    return int(record["run"]["work"]["step"])


def main() -> None:
    evals = _read("gsm8k-eval.jsonl.zst")
    train = _read("agentic-train.jsonl.zst")
    for out, n_eval, steps, per_step in TARGETS:
        out.mkdir(parents=True, exist_ok=True)
        chosen: list[dict[str, Any]] = []
        for step in range(steps):
            at_step = [r for r in train if _step(r) == step]
            at_step.sort(key=lambda r: len(json.dumps(r)))
            chosen.extend(at_step[:per_step])
        sizes = (
            _write(out / "gsm8k-eval.jsonl.zst", evals[:n_eval]),
            _write(out / "agentic-train.jsonl.zst", chosen),
        )
        where = out.relative_to(ROOT)
        print(f"{where}: {n_eval} eval and {len(chosen)} train episodes, {sum(sizes)} bytes")


if __name__ == "__main__":
    main()
