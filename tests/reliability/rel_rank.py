"""One rank of several processes attached to one run (issue #29, ranks).

Usage: python rel_rank.py RUNS_DIR BASE_URL RUN_ID KIND RANK STEPS

The rank is the launcher's ``RANK`` variable (torchrun's), set by the test.
For each step it logs this rank's episodes (ids of its own) and, in a
training run, one metrics row with a key of its own (``loss_r<rank>``) and a
key every rank logs (``lr``), printing a line after each call returned:
``episode <id>`` and ``metrics <step>``. Then ``logged``, and it waits for a
line on its standard input before it finishes the run (the test decides the
order in which ranks finish), printing ``finished`` after ``finish()``.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import workloads

import primeruns as pr

_EVAL_PER_STEP = 3
_TRAIN_PER_STEP = 2


def episodes_of(kind: str, rank: int, steps: int) -> dict[int, list[dict[str, Any]]]:
    """Per step, this rank's episodes: ids no other rank uses."""
    if kind == "eval":
        pool = workloads.gsm8k(4 * steps * _EVAL_PER_STEP)
        per = _EVAL_PER_STEP
        start = rank * steps * per
        return {s: pool[start + s * per : start + (s + 1) * per] for s in range(steps)}
    by_step = workloads.agentic_by_step(_TRAIN_PER_STEP)
    out: dict[int, list[dict[str, Any]]] = {}
    for s in range(steps):
        bundled = by_step[s % len(by_step)]
        # Steps past the bundled 30 and other ranks reuse the data: new ids.
        out[s] = [workloads.renew_ids(copy.deepcopy(e), 1 + rank * 1000 + s) for e in bundled]
        for e in out[s]:
            e["run"]["work"]["step"] = s
    return out


def main() -> None:
    runs_dir, base_url, run_id, kind = sys.argv[1:5]
    rank, steps = int(sys.argv[5]), int(sys.argv[6])
    run = pr.init(
        kind="train" if kind == "train" else "eval",
        id=run_id,
        model="m",
        api_key="test-key-0123456789",
        base_url=base_url,
        runs_dir=runs_dir,
    )
    print("journal", run.journal_path, flush=True)
    for step, batch in episodes_of(kind, rank, steps).items():
        run.log_episodes(batch)
        for episode in batch:
            print("episode", episode["id"], flush=True)
        if kind == "train":
            run.log_metrics({f"loss_r{rank}": 1.0 / (step + 1), "lr": 0.1}, step=step)
            print("metrics", step, flush=True)
    print("logged", flush=True)
    sys.stdin.readline()
    run.finish(timeout=120)
    print("finished", flush=True)


if __name__ == "__main__":
    main()
